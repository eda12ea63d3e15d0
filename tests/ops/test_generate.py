"""`pageserve generate`: flag errors are reported before any model is loaded."""

from __future__ import annotations

import pytest

from ops import generate as demo


def test_bad_sampling_flag_is_a_usage_error(capsys: pytest.CaptureFixture[str]) -> None:
    assert demo.main(["hello", "--temperature", "3"]) == 2
    assert "--temperature" in capsys.readouterr().err


def test_prompt_is_required() -> None:
    with pytest.raises(SystemExit):
        demo.main([])
