"""Continue a prompt with an exported character GPT, by onnxruntime and numpy alone; temperature 0
takes the most likely character each time: python kit/examples/generate_text.py EXPORT_DIR "ROMEO:" 200 0.8"""

import json
import sys
from pathlib import Path

import numpy as np
import onnxruntime

folder, prompt, length = Path(sys.argv[1]), sys.argv[2], int(sys.argv[3])
temperature = float(sys.argv[4]) if len(sys.argv) > 4 else 1.0
spec = json.loads((folder / "model.json").read_text())
vocab, max_tokens = spec["vocab"], spec["input"]["max_T"]
session = onnxruntime.InferenceSession(folder / "model.onnx")
rng, tokens = np.random.default_rng(), [vocab.index(c) for c in prompt]
for _ in range(length):
    context = np.array([tokens[-max_tokens:]], dtype=np.int64)
    logits = session.run(None, {"tokens": context})[0][0, -1].astype(np.float64)
    if temperature == 0:
        tokens.append(int(logits.argmax()))
        continue
    probs = np.exp((logits - logits.max()) / temperature)
    tokens.append(int(rng.choice(len(vocab), p=probs / probs.sum())))
print("".join(vocab[t] for t in tokens))
