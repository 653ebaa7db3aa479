"""Writes profiles/data/copy-edit.json (profiles/speculative.toml's copy-heavy workload):
copy and proofread tasks over paragraphs of this repository's module docstrings, the reply
being the paragraph itself. Run from the repository root."""

import ast
import json
import random
import re
from pathlib import Path

paras = []
for f in sorted(Path(".").glob("[elb]*/**/*.py")):
    if ".venv" in f.parts:
        continue
    doc = ast.get_docstring(ast.parse(f.read_text()))
    if not doc:
        continue
    for block in re.split(r"\n\s*\n", doc):
        p = " ".join(line.strip() for line in block.splitlines() if line.strip())
        if 45 <= len(p.split()) <= 100 and not re.search(r"[`{}|]|\s-\s", p):
            paras.append(p)
rng = random.Random(0)
rng.shuffle(paras)


def typos(p):
    words = p.split()
    for i in rng.sample(range(len(words)), k=max(2, len(words) // 12)):
        w = words[i]
        if len(w) > 4 and w.isalpha():
            j = rng.randrange(1, len(w) - 2)
            words[i] = w[:j] + w[j + 1] + w[j] + w[j + 2 :]
    return " ".join(words)


data = []
for k, p in enumerate(paras[:32]):
    if k % 2 == 0:
        prompt = f"Copy the following text exactly, word for word:\n\n{p}"
    else:
        prompt = (
            "Fix the spelling mistakes in the following text and write out the whole "
            f"corrected text:\n\n{typos(p)}"
        )
    data.append(
        {"conversations": [{"from": "human", "value": prompt}, {"from": "gpt", "value": p}]}
    )
Path("profiles/data/copy-edit.json").write_text(json.dumps(data, indent=1) + "\n")
print(len(paras), len(data))
