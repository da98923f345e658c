"""The chat template's own special tokens: the BOS text a template writes itself, and the token it
ends an assistant turn with, which the engine stops on besides the header's EOS."""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from tapdeck.runner.engine.template import ChatTemplate, turn_end_ids
from tests.runner.engine.test_tool_calls import SMOLLM2_TEMPLATE

# Gemma 3's template, reduced to text content: it writes `{{ bos_token }}` itself and closes each
# turn with `<end_of_turn>`, while Gemma's GGUF header names `<eos>` as EOS.
GEMMA_TEMPLATE = (
    "{{ bos_token }}{% for message in messages %}"
    "{% set role = 'model' if message['role'] == 'assistant' else message['role'] %}"
    "{{ '<start_of_turn>' + role + '\n' + message['content'] + '<end_of_turn>\n' }}{% endfor %}"
    "{% if add_generation_prompt %}{{ '<start_of_turn>model\n' }}{% endif %}"
)


@dataclass
class FakeVocab:
    """Tokenizes by whole special-token markup, then one id per character."""

    specials: dict[str, int]
    special: np.ndarray = field(init=False)

    def __post_init__(self) -> None:
        self.special = np.zeros(1000, dtype=bool)
        self.special[list(self.specials.values())] = True

    def tokenize(self, text: str) -> list[int]:
        ids: list[int] = []
        while text:
            name = next((s for s in self.specials if text.startswith(s)), None)
            if name is not None:
                ids.append(self.specials[name])
                text = text[len(name) :]
            else:
                ids.append(500 + ord(text[0]) % 400)
                text = text[1:]
        return ids


def test_gemma_turns_end_with_end_of_turn() -> None:
    vocab = FakeVocab({"<bos>": 2, "<start_of_turn>": 105, "<end_of_turn>": 106})
    assert turn_end_ids(ChatTemplate(GEMMA_TEMPLATE), vocab) == [106]


def test_chatml_turns_end_with_im_end() -> None:
    vocab = FakeVocab({"<|im_start|>": 1, "<|im_end|>": 2})
    assert turn_end_ids(ChatTemplate(SMOLLM2_TEMPLATE), vocab) == [2]


def test_a_turn_closed_by_plain_text_adds_no_stop_token() -> None:
    template = ChatTemplate("{% for m in messages %}{{ m['role'] }}: {{ m['content'] }}\n{% endfor %}")
    assert turn_end_ids(template, FakeVocab({"<s>": 1})) == []
    assert turn_end_ids(None, FakeVocab({"<s>": 1})) == []


def test_the_template_gets_the_models_bos_text() -> None:
    template = ChatTemplate(GEMMA_TEMPLATE, bos_token="<bos>", eos_token="<eos>")
    text = template.render([{"role": "user", "content": "hi"}])
    assert text == "<bos><start_of_turn>user\nhi<end_of_turn>\n<start_of_turn>model\n"
