"""The table of measured accuracy costs (lightning_mccl.accuracy_costs): every figure is the record's, at the
section it cites; modes are looked up as the strategies and `mccl plan` describe them; the summary line and
PowerSGD's warning name the mode, the cost and the record. No torch."""
from __future__ import annotations

import re
from pathlib import Path

import pytest

from lightning_mccl import accuracy_costs
from lightning_mccl.accuracy_costs import COSTS, DDP, DILOCO, Mode, costs, cost_text, steps_to_reference, summary_line

ROOT = Path(__file__).resolve().parents[2]


def _slug(heading: str) -> str:
    """GitHub's anchor of a heading."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def _section(markdown: str, anchor: str) -> str:
    """The section of `markdown` under the heading whose anchor is `anchor`, its subsections included."""
    fences = [m.span() for m in re.finditer(r"^```.*?^```", markdown, re.M | re.S)]
    heads = [(m.start(), len(m.group(1)), _slug(m.group(2))) for m in re.finditer(r"^(#+) (.+)$", markdown, re.M)
             if not any(a <= m.start() < b for a, b in fences)]
    for i, (start, level, slug) in enumerate(heads):
        if slug == anchor:
            return markdown[start:next((s for s, lv, _ in heads[i + 1:] if lv <= level), len(markdown))]
    raise AssertionError(f"no heading with the anchor #{anchor}")


def test_every_figure_is_in_the_record_section_it_cites():
    for key, found in COSTS.items():
        for c in found:
            page, anchor = c.record.split("#")
            text = (ROOT / page).read_text()
            section = _section(text, anchor)
            assert f"{c.points:.2f} ± {c.spread:.2f}" in section, (key, c)
            assert f"{c.seeds} seeds" in section and f"{c.steps} steps" in text, (key, c)


def test_modes_are_found_as_the_strategies_name_them():
    assert costs(Mode()) == () and cost_text(Mode()).startswith("exact")
    assert costs(Mode(compress="bf16")) == costs(Mode(compress="bf16_hook")) != ()
    assert costs(Mode(compress="fp16")) is None  # never measured: not borrowed from bf16
    assert costs(Mode(compress="powersgd", powersgd_rank=1))[0].points == -32.56
    assert costs(Mode(compress="powersgd", powersgd_rank=4))[0].points == -10.51
    assert costs(Mode(compress="powersgd", powersgd_rank=2)) is None
    fleet = Mode(DILOCO, "bf16", sync_every=4, sync_delay=1)  # H = 4, the whole model, compress="bf16"
    assert [c.steps for c in costs(fleet)] == [256]
    assert [c.steps for c in costs(Mode(DILOCO, None, sync_every=4, sync_delay=1))] == [256, 1024, 2048]
    assert costs(Mode(DILOCO, None, sync_every=4, sync_delay=1, plain_averaging=False)) is None
    assert costs(Mode(DILOCO, "int8", sync_every=4, sync_delay=1)) is None
    # fragments are their own mode: measured at H = 4 in 4 fragments, float32, not borrowed for other counts
    assert [c.points for c in costs(Mode(DILOCO, None, sync_every=4, sync_delay=1, fragments=4))] == [-11.34]
    assert costs(Mode(DILOCO, None, sync_every=4, sync_delay=1, fragments=2)) is None
    assert costs(Mode(DILOCO, "bf16", sync_every=4, sync_delay=1, fragments=4)) is None
    assert "H = 4, tau = 1, 4 fragments, plain averaging" in summary_line(
        Mode(DILOCO, None, sync_every=4, sync_delay=1, fragments=4))
    # the strategy's defaults (H = 3, "auto": 3 fragments on a model of 3 or more tensors), float32: measured
    assert [(c.points, c.seeds) for c in costs(Mode(DILOCO, None, sync_every=3, sync_delay=1, fragments=3))] \
        == [(-7.71, 3)]
    assert costs(Mode(DILOCO, None, sync_every=3, sync_delay=1)) is None  # H = 3, the whole model: not measured


def test_the_summary_line_names_the_mode_its_cost_and_the_record():
    line = summary_line(Mode(DDP, "powersgd", powersgd_rank=1))
    assert line.startswith("mccl: mode: DDP, compress='powersgd', rank 1: ")
    assert "-32.6 ± 3.3 points after 256 steps" in line
    assert "(3 seeds; benchmarks/record/convergence.md#results)" in line
    assert "not on your model" in line
    line = summary_line(Mode(DILOCO, None, sync_every=2, sync_delay=1))
    assert "DiLoCo, H = 2, tau = 1, plain averaging, pseudo-gradients in float32" in line
    assert "-5.8 ± 2.6 points after 256 steps, -1.8 ± 0.1 after 1024 steps, -0.99 ± 0.37 after 2048 steps" in line
    assert "benchmarks/record/diloco.md#what-diloco-costs-in-accuracy" in line
    assert summary_line(Mode(compress="int8")).count("-0.07 ± 0.23 points") == 1
    assert "not measured" in summary_line(Mode(compress="fp16"))
    assert summary_line(Mode()) == "mccl: mode: DDP, float32 gradients: exact: the reference the other modes are " \
                                   "measured against"


def test_powersgd_warning_says_it_changes_the_arithmetic_and_what_it_cost():
    text = accuracy_costs.powersgd_warning(1)
    assert "changes the arithmetic" in text and "-32.6 ± 3.3 points" in text and "convergence.md#results" in text


@pytest.mark.parametrize("mode, factor", [
    (Mode(), 1.0), (Mode(compress="bf16"), 1.0), (Mode(compress="int8"), 1.0),
    (Mode(compress="powersgd", powersgd_rank=1), None), (Mode(DILOCO, None, sync_every=4, sync_delay=1), None),
    (Mode(compress="fp16"), None)])
def test_steps_to_ddps_accuracy_only_where_the_curves_say(mode, factor):
    got, why = steps_to_reference(mode)
    assert got == factor and why
