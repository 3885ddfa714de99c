"""Write lessonkit/data/compiled_saves.json: what a compiled decoder layer and a compiled loss
save for backward.

    python tools/compiled_saves.py            # trace and write the data file
    python tools/compiled_saves.py --check    # exit 1 when the file differs from a new trace

Each family's layer is traced with AOTAutograd and inductor's partitioner
(min_cut_rematerialization_partition) under FakeTensorMode (lessonkit/memory/compiled.py), on a
shape whose widths all differ, and the saved tensors' bytes per token per unit of width stored
(bf16-mixed: under bf16 autocast over fp32 weights, autocast's casts of the weights left out).
torchtune's compiled cross-entropy of one chunk is traced the same way, on bf16 logits.
"""

from __future__ import annotations

import argparse
import datetime
import json
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
DATA = ROOT / "lessonkit" / "data" / "compiled_saves.json"
TRACE_RANK, TRACE_BATCH, TRACE_SEQ = 8, 1, 40


def trace_spec(family: str) -> Any:
    """A two-layer model of ``family`` whose widths all differ: hidden 192, q 240 (6 heads of
    40), intermediate 448, kv 80, 6 and 2 heads, rank 8, one; phi3 (head width hidden / heads,
    q = hidden) kv 64, fused q/k/v 320 and gate/up 896. Read through transformers' config class,
    as a config.json is (its defaults for every other field)."""
    import transformers

    from lessonkit.models.spec import ModelSpec

    fields: dict[str, Any] = dict(
        hidden_size=192,
        intermediate_size=448,
        num_hidden_layers=2,
        num_attention_heads=6,
        num_key_value_heads=2,
        vocab_size=1024,
        pad_token_id=None,
        bos_token_id=None,
        eos_token_id=None,
    )
    if family != "phi3":
        fields["head_dim"] = 40
    config = transformers.AutoConfig.for_model(family, **fields).to_dict()
    return ModelSpec.from_hf_config(config | {"model_type": family}, name=f"traced-{family}")


def traced_layers() -> tuple[dict[str, dict[str, int]], dict[str, list[dict[str, int]]]]:
    """Bytes per token per unit of width saved, and the backward graph's highest moments
    (compiled_trace.backward_profile), by data key, traced now."""
    from lessonkit.memory import compiled, compiled_trace
    from lessonkit.memory.measuring import build_model, validate

    out, backward = {}, {}
    for family in compiled.COMPILED_FAMILIES:
        spec = trace_spec(family)
        for method in compiled.COMPILED_METHODS:
            for precision in compiled.COMPILED_PRECISIONS:
                for input_grad in (True, False):
                    settings = validate(
                        spec,
                        method=method,
                        precision=precision,
                        optimizer="adamw",
                        batch_size=TRACE_BATCH,
                        seq_len=TRACE_SEQ,
                        gradient_checkpointing=False,
                        lora_rank=TRACE_RANK,
                        lora_targets=None,
                        n_gpus=1,
                        zero_stage=0,
                        attention="sdpa",
                        offload_optimizer=False,
                        double_quant=True,
                        lora_dtype="fp32",
                        gradient_accumulation=1,
                        device="cpu",
                    )
                    model = build_model(spec, settings, "meta")
                    fw_module, bw_module, hidden_input = compiled_trace.trace_layer_graphs(
                        model, spec, TRACE_BATCH, TRACE_SEQ, input_grad, precision=precision
                    )
                    inputs = compiled_trace.saved_inputs(fw_module, bw_module, {hidden_input})
                    saved = compiled_trace.saved_tensors(fw_module, bw_module, {hidden_input})
                    key = compiled.data_key(family, method, precision, input_grad)
                    tokens = TRACE_BATCH * TRACE_SEQ
                    out[key] = compiled_trace.per_width_bytes(spec, TRACE_RANK, tokens, saved)
                    backward[key] = compiled_trace.backward_profile(
                        spec, TRACE_RANK, tokens, bw_module, inputs
                    )
    return out, backward


def traced_cross_entropy() -> dict[str, int]:
    """What the compiled cross-entropy of one chunk keeps and makes, per token (traced now)."""
    from lessonkit.memory import compiled_trace

    rows, vocab = TRACE_BATCH * TRACE_SEQ, 1024
    saved, made = compiled_trace.trace_cross_entropy(rows, vocab)
    per_token = [t for t in saved if not t.is_input]
    if any(t.nbytes % rows for t in per_token) or any(t.nbytes % (rows * vocab) for t in made):
        raise SystemExit("the compiled cross-entropy keeps a tensor that is not per token")
    return {
        "keeps_logits": int(any(t.is_input for t in saved)),
        "saved_bytes_per_token": sum(t.nbytes for t in per_token) // rows,
        "gradient_bytes_per_logit": sum(t.nbytes for t in made) // (rows * vocab),
    }


def compact_json(data: dict) -> str:
    """``data`` as indented JSON with each backward moment on one line (a diff of a new trace
    then shows the moments that changed)."""
    moments = data["backward"]
    text = json.dumps(dict(data, backward="BACKWARD"), indent=2)
    lines = [
        f'    "{key}": [\n'
        + ",\n".join(f"      {json.dumps(moment, sort_keys=True)}" for moment in profile)
        + "\n    ]"
        for key, profile in moments.items()
    ]
    return text.replace('"BACKWARD"', "{\n" + ",\n".join(lines) + "\n  }")


def main() -> int:
    import torch

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="compare, do not write")
    args = parser.parse_args()
    (layers, backward), cross_entropy = traced_layers(), traced_cross_entropy()
    if args.check:
        stored = json.loads(DATA.read_text())
        if (stored["layers"], stored["backward"], stored["cross_entropy"]) != (
            layers,
            backward,
            cross_entropy,
        ):
            print(f"{DATA} differs from a trace with torch {torch.__version__}: rerun the tool")
            return 1
        return 0
    data = {
        "about": "Bytes per token per unit of width that one compiled decoder layer saves for "
        "backward (widths: hidden, intermediate, kv = n_kv_heads x head_dim, heads, rank = "
        "the LoRA rank, one). Keys: family/method/precision/whether the layer's input "
        "requires grad (LoRA's first layer does not). backward: by the same keys, the "
        "highest moments of the layer's backward graph (run with eager kernels, each value "
        "released after its last use as inductor's code releases it), what it holds beside "
        "its incoming gradient: its saved tensors until their last use and the tensors it "
        "makes, as bytes per token per unit of a width and bytes per element of a weight "
        "shape ('hidden x q'); 'input' is the part of 'hidden' that is the layer's own input "
        "(held by the checkpoint under gradient checkpointing). cross_entropy: torchtune's compiled "
        "loss of one chunk (compute_cross_entropy on bf16 logits): whether it keeps the "
        "logits for backward, the bytes per token it keeps besides, and the bytes per logit "
        "its backward makes (the logits' gradient).",
        "source": "traced with torch "
        f"{torch.__version__} (CPU): AOTAutograd's aot_function with "
        "torch._functorch.partitioners.min_cut_rematerialization_partition (inductor's "
        "partitioner) on transformers' decoder layer, and with inductor's decompositions "
        "(select_decomp_table) on torchtune's compute_cross_entropy, under FakeTensorMode; "
        "the forward graph's outputs the backward graph takes, de-aliased; "
        "tools/compiled_saves.py",
        "as_of": datetime.date.today().isoformat(),
        "torch_version": torch.__version__,
        "layers": layers,
        "backward": backward,
        "cross_entropy": cross_entropy,
    }
    DATA.write_text(compact_json(data) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
