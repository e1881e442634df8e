"""Models: loading (the embedded default SmolLM2, a hub name, a folder, an existing bridge or
``HookedTransformer``), devices and the model's label.

Example:
    >>> model = lp.models.load_model()          # also lp.load_model
    >>> lp.models.default_device()
    device(type='cpu')
"""

from lensprobe.core.boundary import guard_public
from lensprobe.core.errors import ModelLoadError
from lensprobe.core.models.devices import default_device, hub_reachable
from lensprobe.core.models.loading import cache_dir, load_model, model_label

__all__ = ["ModelLoadError", "cache_dir", "default_device", "hub_reachable", "load_model", "model_label"]

guard_public(globals())  # public functions raise one LensprobeError (lensprobe.core.boundary)
