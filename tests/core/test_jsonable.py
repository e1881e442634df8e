"""describe_setting: settings as JSON for a trace's meta."""

import lensprobe as lp
from lensprobe.core.storage.jsonable import describe_setting


def test_structured_types_are_described_field_by_field_others_by_stable_repr():
    def odd(pos, tok):
        return pos % 2 == 1

    class Opaque:
        pass

    got = describe_setting({"think": lp.generation.Pause(), "sets": [odd, 3, None], "x": Opaque()}, structured=(lp.generation.Pause,))
    assert got["think"] == {"type": "Pause", "token": "<thinking>"}
    assert got["sets"] == ["function odd", 3, None]
    assert "Opaque object" in got["x"] and " at 0x" not in got["x"]
    assert describe_setting(lp.generation.Pause()).startswith("Pause(")  # not a structured type: its repr
    assert len(describe_setting("y" * 500)) == 500 and len(describe_setting(Opaque(), ())) <= 300
