"""Experiment runners over the hook objects: ablation sweeps (:mod:`.sweep`), activation patching
(:mod:`.patching`; per head across prompts of different lengths: :mod:`.headpatch`), attribution (:mod:`.attribution`, with AtP and AtP* for one prompt in :mod:`.atp`: its gradient
pass and GradDrop in :mod:`.atp_gradients`, its QK fix in :mod:`.atp_qkfix`) and its exact
verification (:mod:`.verify`), the search for the heads that matter (:mod:`.findheads`), and their configurations (:mod:`.head_settings`). Each runs many forwards,
identifies itself by content and saves into the results store.

May import: :mod:`lensprobe.core`, :mod:`lensprobe.interventions` and :mod:`lensprobe.generation`.
"""

from lensprobe.core.boundary import guard_public
from lensprobe.experiments.attribution import Attribution, attribute_heads
from lensprobe.experiments.findheads import HeadSearch, find_heads
from lensprobe.experiments.headpatch import HeadPatch, patch_heads
from lensprobe.experiments.patching import PatchResult, patch
from lensprobe.experiments.sweep import SweepResult, ablation_sweep
from lensprobe.experiments.verify import Verification, verify_attribution

__all__ = ["Attribution", "HeadPatch", "HeadSearch", "PatchResult", "SweepResult", "Verification", "ablation_sweep",
           "attribute_heads", "find_heads", "patch", "patch_heads", "verify_attribution"]

guard_public(globals())  # public functions raise one LensprobeError (lensprobe.core.boundary)
