"""`licensectl run` flags: every help text renders (argparse %-formats them) and the rotation flags
reject bad values with a message naming where the value came from."""

from __future__ import annotations

import pytest

from licensectl import config
from licensectl.cli import main as cli


def test_run_help_renders_every_flag(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as e:
        cli.main(["run", "--help"])
    assert e.value.code == 0
    out = capsys.readouterr().out
    for o in config.OPTIONS:
        assert o.flag in out
    assert '("5%")' in out and "10%,50%,100%" in out


@pytest.mark.parametrize(("env", "value"), [("LICENSECTL_CANARY", "three"), ("LICENSECTL_ROLLOUT_STEPS", "50%,10%"),
                                            ("LICENSECTL_MAX_RESTARTS_PER_MINUTE", "ten")])
def test_bad_rotation_settings_name_their_source(env: str, value: str) -> None:
    with pytest.raises(ValueError) as e:
        config.settings_from(None, {env: value})
    assert env in str(e.value)  # where the bad value came from


def test_rotation_settings_parse() -> None:
    s = config.settings_from(None, {"LICENSECTL_CANARY": "namespaces:a,b", "LICENSECTL_ROLLOUT_STEPS": "20%"})
    assert (s.canary, s.rollout_steps, s.done_gate) == ("namespaces:a,b", "20%", "ready-licensed")


def test_the_demo_is_dev_tooling_not_a_licensectl_command(capsys: pytest.CaptureFixture[str]) -> None:
    """`make demo` runs `python -m licensectl_dev.demo` with the flags it always had; the shipped CLI,
    which cannot run it from the image, no longer offers `demo`."""
    from licensectl_dev import demo

    with pytest.raises(SystemExit) as e:
        demo.main(["--help"])
    assert e.value.code == 0
    out = capsys.readouterr().out
    for flag in ("--duration", "--prometheus", "--json", "--metrics-port"):
        assert flag in out
    args = demo._parser().parse_args(["--duration", "80", "--prometheus", "--metrics-port", "0", "--json", "x.json"])
    assert (args.duration, args.prometheus, args.metrics_port, args.json_out) == (80.0, True, 0, "x.json")
    with pytest.raises(SystemExit) as e:
        cli.main(["demo"])
    assert e.value.code == 2
    assert "invalid choice: 'demo'" in capsys.readouterr().err
