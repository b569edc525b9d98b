"""Prompt rendering per family with tools and thinking (issue 10): the start stage of the output, the
tool declarations, and past calls rendered in the wire format the decoder reads (one set of rules)."""
from __future__ import annotations

import json

import pytest

from gpu_engine.frontend.template import ChatTemplate
from gpu_engine.frontend.families import QWEN3_5_TEMPLATE, QWEN3_TEMPLATE, FamilyChat
from ninfer_common.frontends import QWEN3, QWEN3_5, SMOLLM2, FrontendError, OutputDecoder, ToolChoice, parse_tools, resolve_policy

TOOLS = parse_tools([{"name": "lookup", "description": "weather", "strict": True, "parameters": {
    "type": "object", "properties": {"city": {"type": "string"}, "days": {"type": "integer"}},
    "required": ["city", "days"], "additionalProperties": False}}])
CHATS = {
    "smollm2": FamilyChat(SMOLLM2, ChatTemplate(None, eos_token="<|im_end|>")),
    "qwen3": FamilyChat(QWEN3, ChatTemplate(QWEN3_TEMPLATE)),
    "qwen3.5": FamilyChat(QWEN3_5, ChatTemplate(QWEN3_5_TEMPLATE)),
}
USER = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Weather in Oslo?"}]


@pytest.mark.parametrize("family", ["qwen3", "qwen3.5"])
def test_thinking_start_stage(family):
    fc = CHATS[family]
    on = fc.render(USER, TOOLS, thinking=True)
    off = fc.render(USER, TOOLS, thinking=False)
    assert on.endswith("<|im_start|>assistant\n<think>\n")
    assert off.endswith("<|im_start|>assistant\n<think>\n\n</think>\n\n")
    assert on.count("<think>") == 1 and fc.thinking_enabled(None) is True
    assert '"name": "lookup"' in on and on.startswith("<|im_start|>system\nBe brief.\n\n# Tools")


def test_smollm2_tools_in_system_prompt_and_no_thinking():
    fc = CHATS["smollm2"]
    p = fc.render(USER, TOOLS)
    sys_msg = p.split("<|im_end|>")[0]
    assert sys_msg.startswith("<|im_start|>system\nBe brief.\n\nYou are an expert in composing functions.")
    assert '<tools>[{"name": "lookup"' in sys_msg and "<tool_call>" in sys_msg
    assert p.endswith("<|im_start|>assistant\n")
    with pytest.raises(FrontendError) as ei:
        fc.render(USER, TOOLS, thinking=True)
    assert "SmolLM2" in ei.value.message and ei.value.kind == "InvalidRequest"
    assert fc.thinking_enabled(None) is False


@pytest.mark.parametrize("family", ["smollm2", "qwen3", "qwen3.5"])
def test_past_calls_render_in_the_decoded_wire_format(family):
    fc = CHATS[family]
    args = {"city": "New\nYork ", "days": 3}
    history = USER + [{"role": "assistant", "content": "", "tool_calls": [{"name": "lookup", "arguments": args},
                                                                           {"name": "lookup", "arguments": json.dumps({"city": "Rome", "days": 1})}]},
                      {"role": "tool", "content": "sunny"}]
    p = fc.render(history, TOOLS, add_generation_prompt=False)
    turn = p.split("<|im_start|>assistant\n")[1].split("<|im_end|>")[0]
    policy = resolve_policy(TOOLS, ToolChoice("required"), None)
    dec = OutputDecoder(fc.rules, policy)
    dec.feed(turn.encode())
    _, res = dec.finish()
    assert [json.loads(c.arguments_json) for c in res.tool_calls] == [args, {"city": "Rome", "days": 1}]
    assert res.content == "" and "sunny" in p


def test_real_smollm2_template_gets_tools_in_the_system_prompt():
    import os
    from pathlib import Path

    path = Path(os.environ.get("NINFER_CACHE_DIR", Path.home() / ".cache" / "ninfer" / "models")) / \
        "SmolLM2-135M-Instruct.Q4_1.gguf"
    if not path.exists():
        pytest.skip("SmolLM2 GGUF not downloaded")
    from gpu_engine.model.gguf_file import GGUFFile
    from gpu_engine.model.loader import _gguf_tokenizer_and_chat

    tok, template = _gguf_tokenizer_and_chat(GGUFFile(path), None)
    assert "tools" not in template.source  # the GGUF template has no tool section
    fc = FamilyChat(SMOLLM2, template)
    p = fc.render([{"role": "user", "content": "Weather in Oslo?"}], TOOLS)
    assert p.startswith("<|im_start|>system\nYou are an expert in composing functions.")
    assert '<tools>[{"name": "lookup", "description": "weather"' in p
    assert p.endswith("<|im_start|>user\nWeather in Oslo?<|im_end|>\n<|im_start|>assistant\n")
