"""The ptychography verbs, one thin module each (``add_arguments(p)``, ``make_job(args,
resources) -> Job``): they parse and check the options, then delegate to
``outcore.ptycho.simulate``, ``outcore.ptycho.preprocessing`` and
``outcore.ptycho.reconstruction``. ``outcore.ptycho.cli`` lists them."""
