"""`pageserve up --model FOLDER` serves a tiny random folder of each architecture through the gateway.

Each folder carries a tokenizer trained for it (tests/support/tiny_tokenizer.py) and a chat template of
its own (chat_template.jinja), so a chat's prompt tokens prove the folder's template rendered it.
Streamed chat and streamed completions through the official SDK. The suite serves the architectures
whose options reach the most code (windows and soft-caps, experts, partial rotary with LongRoPE, q/k
norms); `PAGESERVE_E2E_ALL_ARCHITECTURES=1` serves every one (about 20 s each on 2 cores).
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import openai
import pytest
import tokenizers

from tests.support.redis_server import free_port
from tests.support.tiny_model import ARCHITECTURES, tiny_folder
from tests.support.tiny_tokenizer import tiny_tokenizer
from tests.support.up_process import UpProcess

pytestmark = [pytest.mark.e2e, pytest.mark.slow]

IN_SUITE = ("gemma2", "qwen3_moe", "phi3")
SERVED = sorted(ARCHITECTURES) if os.environ.get("PAGESERVE_E2E_ALL_ARCHITECTURES") else IN_SUITE
TEMPLATE = "{% for m in messages %}<s>[{{ m.role }}] {{ m.content }}\n{% endfor %}[assistant] "


@pytest.mark.parametrize("architecture", SERVED)
def test_up_serves_the_folder_with_its_own_template(architecture: str, tmp_path: Path) -> None:
    folder = tiny_folder(architecture, tmp_path / architecture)
    tokenizer = tiny_tokenizer(folder)
    (folder / "chat_template.jinja").write_text(TEMPLATE)
    port = free_port()
    up = UpProcess(["--model", str(folder), "--port", str(port), "--engine-args", "--dtype float32 --threads 1"])
    try:
        key = up.wait_for_re(r"^\s+(ps-\S+)$", timeout_s=240).group(1)
        client = openai.OpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key=key, max_retries=0)
        messages = [{"role": "user", "content": "The quick brown fox"}]
        chat = client.chat.completions.create(model=str(folder), messages=messages, max_tokens=6, temperature=0,
                                              stream=True, stream_options={"include_usage": True})
        chunks = list(chat)
        usage = chunks[-1].usage
        assert usage is not None and usage.completion_tokens == 6
        rendered = "<s>[user] The quick brown fox\n[assistant] "
        assert usage.prompt_tokens == len(tokenizers.Tokenizer.from_file(str(tokenizer)).encode(rendered).ids)
        text = client.completions.create(model=str(folder), prompt="The quick", max_tokens=5, temperature=0,
                                          stream=True, stream_options={"include_usage": True})
        parts = list(text)
        assert parts[-1].usage is not None and parts[-1].usage.completion_tokens == 5
    finally:
        up.stop()
    assert up.proc.returncode == 0, up.output


def test_an_unsupported_knob_stops_the_engine_naming_the_key(tmp_path: Path) -> None:
    folder = tiny_folder("qwen2", tmp_path / "qwen2", rope_parameters={"rope_type": "yarn", "factor": 4.0,
                                                                       "rope_theta": 10000.0,
                                                                       "original_max_position_embeddings": 256})
    run = subprocess.run([sys.executable, "-m", "ops.cli", "engine", "--model", str(folder), "--listen",
                          f"tcp://127.0.0.1:{free_port()}"], capture_output=True, text=True, timeout=120)
    assert run.returncode != 0
    assert re.search(r"rope_scaling\.rope_type='yarn' is not supported", run.stdout + run.stderr)
