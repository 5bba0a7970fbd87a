"""What the model generates is trained: reasoning, tool calls and channels, read off the chat template.

`input_ids` equal `apply_chat_template(messages, tools=...)`; labels agree with the `{% generation %}` masks of every
training template installed with `trl` (`tools/template_agreement.py`).
"""

import importlib.util
import json
import sys
from pathlib import Path

import pytest
from transformers import AutoTokenizer

from flatcollate.data import RowError, build_encoder

from .label_runs import trained_runs

trl = pytest.importorskip("trl")
TEMPLATES = Path(trl.__file__).parent / "chat_templates"
CITY = {"type": "object", "properties": {"city": {"type": "string"}}}
WEATHER = {"name": "get_weather", "description": "Weather in a city.", "parameters": CITY}
TOOLS = [{"type": "function", "function": WEATHER}]


def call(arguments):
    return {"type": "function", "function": {"name": "get_weather", "arguments": arguments}}


@pytest.fixture(scope="module")
def qwen(tokenizer_dir):
    return AutoTokenizer.from_pretrained(tokenizer_dir("qwen2.5-instruct"))


@pytest.mark.parametrize("arguments", [{"city": "Paris"}, '{"city": "Paris"}'], ids=["dict", "json_string"])
def test_tool_calls_and_tools_are_rendered_and_trained(qwen, arguments):
    messages = [
        {"role": "user", "content": "Weather in Paris?"},
        {"role": "assistant", "content": "", "tool_calls": [call(arguments)]},
        {"role": "tool", "content": '{"sky": "cloudy"}'},
        {"role": "assistant", "content": "Cloudy."},
    ]
    out = build_encoder(qwen, format="messages")({"messages": messages, "tools": json.dumps(TOOLS)}, index=0)
    assert out["input_ids"] == list(qwen.apply_chat_template(messages, tools=TOOLS)["input_ids"])
    runs = [qwen.decode(r) for r in trained_runs(out["labels"])]
    rendered = json.dumps({"name": "get_weather", "arguments": arguments}, ensure_ascii=False)
    assert runs == [f"<tool_call>\n{rendered}\n</tool_call><|im_end|>\n", "Cloudy.<|im_end|>\n"]


def test_reasoning_and_content_parts_are_trained(qwen):
    template = (TEMPLATES / "qwen3_training.jinja").read_text()
    messages = [
        {"role": "user", "content": [{"type": "text", "text": "Capital of France?"}]},
        {"role": "assistant", "content": "Paris.", "reasoning_content": "France's capital is Paris."},
    ]
    out = build_encoder(qwen, format="messages", chat_template=template)({"messages": messages})
    assert out["input_ids"] == list(qwen.apply_chat_template(messages, chat_template=template)["input_ids"])
    (run,) = trained_runs(out["labels"])
    assert qwen.decode(run) == "<think>\nFrance's capital is Paris.\n</think>\n\nParis.<|im_end|>\n"


def test_earlier_reasoning_dropped_by_the_template_is_not_trained(qwen):
    """Qwen3's shipped template renders reasoning only after the last user message: the first reply is trained as
    rendered (its training variant keeps every turn's reasoning)."""
    template = (TEMPLATES / "qwen3.jinja").read_text()
    turn = {"role": "assistant", "content": "A.", "reasoning_content": "think 1"}
    messages = [{"role": "user", "content": "q1"}, turn, {"role": "user", "content": "q2"}, {**turn, "content": "B."}]
    out = build_encoder(qwen, format="messages", chat_template=template)({"messages": messages})
    assert [qwen.decode(r) for r in trained_runs(out["labels"])] == [
        "A.<|im_end|>\n",
        "<think>\nthink 1\n</think>\n\nB.<|im_end|>\n",
    ]


def test_channel_headers_are_trained(qwen):
    template = (TEMPLATES / "gptoss_training.jinja").read_text()
    messages = [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "yo", "thinking": "greet"}]
    out = build_encoder(qwen, format="messages", chat_template=template)({"messages": messages})
    (run,) = trained_runs(out["labels"])
    assert qwen.decode(run) == (
        "<|channel|>analysis<|message|>greet<|end|><|start|>assistant<|channel|>final<|message|>yo<|return|>"
    )


def test_a_template_that_rewrites_history_is_refused_naming_the_message(qwen):
    template = (
        "{% for m in messages %}{% if m.role == 'assistant' and loop.last %}<a>{{ m.content }}</a>"
        "{% elif m.role == 'assistant' %}<a>(earlier)</a>{% else %}<u>{{ m.content }}</u>{% endif %}{% endfor %}"
        "{% if add_generation_prompt %}<a>{% endif %}"
    )
    messages = [{"role": "user", "content": "q"}, {"role": "assistant", "content": "one"},
                {"role": "user", "content": "r"}, {"role": "assistant", "content": "two"}]
    with pytest.raises(RowError, match=r"row 3: field 'messages', message 1 \(assistant, 'one'\).*differently") as err:
        build_encoder(qwen, format="messages", chat_template=template)({"messages": messages}, index=3)
    assert err.value.reason == "template_rewrites_history"


def _agreement_tool():
    path = Path(__file__).parents[2] / "tools" / "template_agreement.py"
    spec = importlib.util.spec_from_file_location("template_agreement", path)
    module = importlib.util.module_from_spec(spec)
    sys.modules.setdefault("template_agreement", module)
    spec.loader.exec_module(module)
    return module


def test_labels_agree_with_every_trl_training_template(qwen):
    """Every `*_training.jinja` of the installed trl whose base renders the same text, four kinds of conversations
    (docs/data.md has the table and the reason for each remaining difference)."""
    tool = _agreement_tool()
    result = tool.measure(qwen, TEMPLATES)
    for kind, counts in result["counts"].items():
        compared = counts["agree"] + counts["differ"]
        assert compared >= 30 and counts["agree"] / compared >= 0.92, (kind, counts, result["details"])
    for kind in ("plain", "system", "reasoning"):
        assert result["counts"][kind]["differ"] == 0, result["details"]
    # Remaining differences, each documented: Diffusion-Gemma renders the tool response inside the assistant turn,
    # gpt-oss marks the header of a turn following a tool result.
    assert {(name, kind) for name, kind, _, outcome, _ in result["details"] if outcome == "differ"} <= {
        ("diffusion_gemma", "tools"),
        ("gptoss", "tools"),
    }
