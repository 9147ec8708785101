"""The tomography verbs, one thin module each (``add_arguments(p)``, ``make_job(args,
resources) -> Job``): ``simulate``, ``reconstruct``, ``center`` and ``convert`` parse the
options into the keywords of the public functions (``outcore.tomo.simulate_scan``,
``reconstruct``, ``find_center``'s search, ``open_scan``'s reader), plan, and write the run
directory; ``options`` holds the options several verbs share and the refusals only the
command line can need, ``resume`` a resumed run's checks. ``outcore.tomo.cli`` lists them."""
