"""Write the two lm-evaluation-harness tasks behind this folder's sample files (see README.md).

Usage: python make_tasks.py WORK_DIR GSM8K_TEST_JSONL

Writes WORK_DIR/tasks/{tiny_gsm8k.jsonl, tiny_gsm8k_mc.yaml, tiny_gsm8k_gen.yaml}: the first 24
GSM8K test items (the runs use --limit 20), each with two numeric choices (the gold answer and
gold + 1, the gold first on even items) so that a random model scores about 50% `acc` and two
random models disagree on some items, and a generate-until task scored by `exact_match` under
two filters, as lm-eval's own GSM8K task is.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

N_ITEMS = 24

MC_YAML = """task: tiny_gsm8k_mc
dataset_path: json
dataset_kwargs:
  data_files:
    test: {data}
test_split: test
output_type: multiple_choice
doc_to_text: "Question: {{{{question}}}}\\nAnswer:"
doc_to_choice: choices
doc_to_target: label
metric_list:
  - metric: acc
    aggregation: mean
    higher_is_better: true
metadata:
  version: 1.0
"""

GEN_YAML = """task: tiny_gsm8k_gen
dataset_path: json
dataset_kwargs:
  data_files:
    test: {data}
test_split: test
output_type: generate_until
doc_to_text: "Question: {{{{question}}}}\\nAnswer:"
doc_to_target: gold
generation_kwargs:
  until: ["\\n\\n", "Question:"]
  do_sample: false
  max_gen_toks: 16
metric_list:
  - metric: exact_match
    aggregation: mean
    higher_is_better: true
    ignore_case: true
    ignore_punctuation: false
filter_list:
  - name: strict-match
    filter:
      - function: regex
        regex_pattern: "#### (\\\\-?[0-9\\\\.\\\\,]+)"
      - function: take_first
  - name: flexible-extract
    filter:
      - function: regex
        group_select: -1
        regex_pattern: "(-?[$0-9.,]{{2,}})|(-?[0-9]+)"
      - function: take_first
metadata:
  version: 1.0
"""


def main(work: Path, gsm8k_test: Path) -> None:
    tasks = work / "tasks"
    tasks.mkdir(parents=True, exist_ok=True)
    rows = [json.loads(line) for line in gsm8k_test.read_text(encoding="utf-8").splitlines()]
    data = tasks / "tiny_gsm8k.jsonl"
    with data.open("w", encoding="utf-8") as f:
        for i, row in enumerate(rows[:N_ITEMS]):
            gold = row["answer"].split("####")[-1].strip().replace(",", "")
            wrong = str(int(gold) + 1)
            choices = [gold, wrong] if i % 2 == 0 else [wrong, gold]
            doc = {"question": row["question"], "gold": gold, "choices": choices}
            doc["label"] = choices.index(gold)
            f.write(json.dumps(doc) + "\n")
    (tasks / "tiny_gsm8k_mc.yaml").write_text(MC_YAML.format(data=data), encoding="utf-8")
    (tasks / "tiny_gsm8k_gen.yaml").write_text(GEN_YAML.format(data=data), encoding="utf-8")


if __name__ == "__main__":
    main(Path(sys.argv[1]), Path(sys.argv[2]))
