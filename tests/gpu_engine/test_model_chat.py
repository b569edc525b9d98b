"""Chat template rendering vs transformers' apply_chat_template."""
from __future__ import annotations

import pytest

from gpu_engine.frontend.template import ChatTemplate, ChatTemplateError, render_chat
from gpu_engine.hub.fetch import cached_model_path

GGUF = cached_model_path()
CONVERSATIONS = [
    [{"role": "user", "content": "What is 2+2?"}],
    [{"role": "system", "content": "Answer in JSON."}, {"role": "user", "content": "Name a colour."}],
    [{"role": "user", "content": "héllo 🤗"}, {"role": "assistant", "content": "Hi!"}, {"role": "user", "content": "  spaces\n\n"}],
]


@pytest.mark.slow
@pytest.mark.skipif(GGUF is None, reason="SmolLM2 GGUF not in cache: run `python -m gpu_engine.hub.fetch` first")
def test_matches_transformers() -> None:
    transformers = pytest.importorskip("transformers")
    from gpu_engine.model.loader import load_tokenizer

    _, chat = load_tokenizer(str(GGUF))
    hf = transformers.AutoTokenizer.from_pretrained(str(GGUF.parent), gguf_file=GGUF.name)
    for msgs, gen in [(m, g) for m in CONVERSATIONS for g in (True, False)]:
        assert chat.render(msgs, add_generation_prompt=gen) == hf.apply_chat_template(
            msgs, tokenize=False, add_generation_prompt=gen)


def test_default_chatml_and_helpers() -> None:
    out = render_chat([{"role": "user", "content": "hi"}])
    assert out == "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n"


def test_trim_blocks_tojson_and_raise_exception() -> None:
    src = ("{% for m in messages %}\n  {% if m.role == 'bad' %}{{ raise_exception('role ' + m.role + ' not allowed') }}{% endif %}"
           "{{ bos_token }}{{ m | tojson }}\n{% endfor %}")
    t = ChatTemplate(src, bos_token="<s>")
    assert t.render([{"role": "user", "content": "é"}]) == '<s>{"role": "user", "content": "é"}\n'
    with pytest.raises(ChatTemplateError, match="role bad not allowed"):
        t.render([{"role": "bad", "content": ""}])


def test_sandbox_blocks_attribute_escape() -> None:
    t = ChatTemplate("{{ messages.__class__.__mro__ }}")
    with pytest.raises(ChatTemplateError):
        t.render([])
