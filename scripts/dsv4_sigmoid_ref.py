#!/usr/bin/env python3
"""Writes tests/fixtures/dsv4-sigmoid-ref/: transformers' reference (ref.json and the logits)
for the tiny-deepseek-v4 fixture's weights read with `"scoring_func": "sigmoid"`, the
router score DeepSeek-V4's config allows beside sqrt-softplus. transformers' hash router
weighs its table's experts by that score too, so the fixture's two hash layers check it
(scripts/sweep_families.py found colibri weighing them by sqrt-softplus whatever the key).
The weights are the fixture's own: the test copies the fixture with the key edited. The short
case only: on the long one a learned router's top-k gap falls to 6.8e-05, under the fixtures'
1e-4 (a near tie is no test of the hash layers).

    /work/venv-fixtures/bin/python scripts/dsv4_sigmoid_ref.py
"""

import json
import sys
from pathlib import Path

import torch
from transformers import DeepseekV4Config, DeepseekV4ForCausalLM

sys.path.insert(0, str(Path(__file__).resolve().parent))
import make_fixture_deepseek_v4 as mdv4  # noqa: E402
from make_fixtures import MIN_GAP, ROOT  # noqa: E402

OUT = "tests/fixtures/dsv4-sigmoid-ref"


def main():
    src = ROOT / mdv4.DIR
    fixture_ref = json.loads((src / "ref.json").read_text())
    config = DeepseekV4Config.from_pretrained(src, scoring_func="sigmoid")
    config._attn_implementation = "eager"
    model = DeepseekV4ForCausalLM.from_pretrained(src, config=config).float().eval()
    out = ROOT / OUT
    out.mkdir(parents=True, exist_ok=True)
    ref = {"meta": {"weights": mdv4.DIR, "scoring_func": "sigmoid", "min_gaps": {},
                    "transformers": __import__("transformers").__version__,
                    "torch": torch.__version__}}
    for name in ("short",):
        prompt = fixture_ref[name]["prompt_ids"]
        n_new = len(fixture_ref[name]["full_ids"]) - len(prompt)
        case, logits, gaps = mdv4.run_case(model, prompt, n_new)
        if any(g is not None and g < MIN_GAP for g in gaps.values()):
            raise SystemExit(f"{name}: a margin under {MIN_GAP}: {gaps}")
        ref["meta"]["min_gaps"][name] = gaps
        fname = f"logits_{name}.f32"
        logits.tofile(out / fname)
        case["logits_file"] = fname
        ref[name] = case
    (out / "ref.json").write_text(json.dumps(ref, separators=(",", ":")) + "\n")
    print(f"{OUT}: gaps {ref['meta']['min_gaps']}")


if __name__ == "__main__":
    main()
