"""The yardstick's timing: llama.cpp (through llama-cpp-python, never a ds4d dependency)
prefill and greedy decode speed on a GGUF, for the speed tables beside `ds4d bench`.

Usage: PEER/bin/python scripts/figures/llamacpp_speed.py MODEL.gguf PROMPT.txt \
           [threads] [prompt_tokens] [gen_tokens]
Prints one JSON line: engine, threads, prompt_tokens, prefill_tps, decode_tps.
(scripts/figures/decode_figure.py runs it with `--peer-script`.)
"""

import json
import sys
import time

import llama_cpp
import numpy as np

model, prompt_file = sys.argv[1], sys.argv[2]
threads = int(sys.argv[3]) if len(sys.argv) > 3 else 2
n_prompt = int(sys.argv[4]) if len(sys.argv) > 4 else 512
n_gen = int(sys.argv[5]) if len(sys.argv) > 5 else 128

llm = llama_cpp.Llama(model_path=model, n_ctx=max(2048, n_prompt + n_gen + 16), n_threads=threads,
                      n_threads_batch=threads, n_batch=512, verbose=False)  # fmt: skip
text = open(prompt_file, encoding="utf-8").read()
toks = llm.tokenize(text.encode(), add_bos=False, special=False)[:n_prompt]
llm.reset()
t0 = time.perf_counter()
llm.eval(toks)
t1 = time.perf_counter()
# greedy decode n_gen tokens one at a time
for _ in range(n_gen):
    logits = np.ctypeslib.as_array(llama_cpp.llama_get_logits(llm.ctx), shape=(llm.n_vocab(),))
    tok = int(np.argmax(logits))
    llm.eval([tok])
t2 = time.perf_counter()
print(json.dumps({"engine": "llama.cpp", "threads": threads, "prompt_tokens": len(toks),
                  "prefill_tps": len(toks) / (t1 - t0), "decode_tps": n_gen / (t2 - t1)}))  # fmt: skip
