"""A GGUF conversion says once that it starts and how long it took; a load that finds the converted folder says
nothing."""

from pathlib import Path

from lensprobe.core.models.announce import CONVERSION_SECONDS, announced, conversion_notice
from lensprobe.core.models.cache import cached_conversion


def test_the_conversion_is_announced_once_with_its_duration(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("LENSPROBE_CACHE", str(tmp_path / "cache"))
    source = tmp_path / "model.gguf"
    source.write_bytes(b"GGUF" + bytes(60))
    calls = []
    ticks = iter([100.0, 136.4])

    def convert(gguf: Path, folder: Path) -> None:
        calls.append(gguf)
        folder.mkdir(parents=True)
        (folder / "config.json").write_text("{}")

    first = cached_conversion(source, announced(convert, clock=lambda: next(ticks)))
    err = capsys.readouterr().err.splitlines()
    assert err == [conversion_notice(source, first), "lensprobe: converted model.gguf in 36 s"]
    assert err[0].startswith(f"lensprobe: converting model.gguf into a safetensors folder in {tmp_path / 'cache'}")
    assert f"about {CONVERSION_SECONDS} s" in err[0] and "once" in err[0]
    again = cached_conversion(source, announced(convert))
    assert again == first and len(calls) == 1
    assert capsys.readouterr().err == ""  # the folder was there: nothing converted, nothing said
