"""The demo report's sections, one module per study: ``build(model, *, quick) -> Section | list``."""
