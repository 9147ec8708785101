"""The tomography verbs, one thin module each (``add_arguments(p)``, ``make_job(args,
resources) -> Job``): ``simulate``, ``reconstruct``, ``center`` and ``convert`` parse and
check the options, then delegate to the operators (``outcore.tomo.simulate``, ``.raw``,
``.corrections``, ``.center``, ``.reconstruct``); ``options`` holds the options two verbs
share. ``outcore.tomo.cli`` lists them."""
