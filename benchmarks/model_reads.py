"""Which lensprobe modules read the model's facts during one ``lp.evaluate``, and how often.

The model's facts (tokenizer, context length, vocabulary, end ids, device, name, configuration) live in
``model.cfg``, ``model.tokenizer`` and the wrapped Hugging Face model (``model.original_model``). This script
runs ``lp.evaluate`` on the tiny random model (two problems, ``"w/o,w/ Mless"``, 4 new tokens) with the
model's class swapped for a subclass that notes the module of every read of those three attributes, then
prints, per lensprobe module, the number of reads; and the modules' count. Reads made by TransformerLens
itself (inside a forward) are not lensprobe's and are not counted.

    PYTHONPATH=. python benchmarks/model_reads.py
"""

import collections
import sys

import lensprobe as lp
from lensprobe.core.models.testing import tiny_model
from lensprobe.evals.problems.load import Problem

FACTS = frozenset({"cfg", "tokenizer", "original_model"})


def watched(model, reads: collections.Counter):
    """``model`` with its class swapped for one that counts reads of :data:`FACTS` by caller module."""
    base = type(model)

    def __getattribute__(self, name):
        if name in FACTS:
            caller = sys._getframe(1).f_globals.get("__name__", "?")
            if caller.startswith("lensprobe."):
                reads[caller] += 1
        return base.__getattribute__(self, name)

    model.__class__ = type(base.__name__, (base,), {"__getattribute__": __getattribute__})
    return model


def main() -> None:
    reads: collections.Counter = collections.Counter()
    model = watched(tiny_model(), reads)
    problems = [Problem(id=str(i), problem=f"What is {i} + {i}?", answer=str(2 * i)) for i in range(2)]
    lp.evaluate(model, problems, "w/o,w/ Mless", max_new_tokens=4, progress=False)
    for module, n in sorted(reads.items(), key=lambda kv: (-kv[1], kv[0])):
        print(f"{n:6d}  {module}")
    print(f"{len(reads)} modules read model.cfg / model.tokenizer / model.original_model "
          f"({sum(reads.values())} reads) during one lp.evaluate")


if __name__ == "__main__":
    main()
