"""The OOM doctor: real out-of-memory messages read field by field, and the first fix for each.

The corpus holds messages as PyTorch printed them (CUDA and ROCm, PyTorch 1.x/2.0, 2.1 with its
"capacty" typo, 2.2+, the newest wording with private pools; MPS; the driver; torchrun's rank
prefixes; Trainer and accelerate), copied from public logs and issue threads, and checked against
the format strings in PyTorch's c10/cuda/CUDACachingAllocator.cpp.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from work_counter import count_calls

import lessonkit
from lessonkit import oom_doctor
from lessonkit.planning.oom_messages import parse_oom

ROOT = Path(__file__).resolve().parents[2]
KiB, MiB, GiB = 2**10, 2**20, 2**30


def gib(x: float) -> int:
    return round(x * GiB)


def mib(x: float) -> int:
    return round(x * MiB)


CORPUS = [
    dict(  # PyTorch 1.x-2.0 (CUDA): another process holds most of the card
        id="pytorch-1.x",
        text=(
            "RuntimeError: CUDA out of memory. Tried to allocate 36.00 MiB (GPU 0; 7.93 GiB total "
            "capacity; 130.35 MiB already allocated; 47.06 MiB free; 188.00 MiB reserved in total "
            "by PyTorch) If reserved memory is >> allocated memory try setting max_split_size_mb "
            "to avoid fragmentation.  See documentation for Memory Management and "
            "PYTORCH_CUDA_ALLOC_CONF"
        ),
        fields=dict(
            backend="cuda",
            wording="pytorch-2.0-",
            device=0,
            tried_bytes=mib(36),
            total_bytes=gib(7.93),
            allocated_bytes=mib(130.35),
            free_bytes=mib(47.06),
            reserved_bytes=mib(188),
            alloc_conf_hint="max_split_size_mb",
        ),
        first_fix="free_other_process",
    ),
    dict(  # PyTorch 2.1: "capacty", processes listed by id (a container: ours is one of them)
        id="pytorch-2.1-processes",
        text=(
            "torch.cuda.OutOfMemoryError: CUDA out of memory. Tried to allocate 448.00 MiB. GPU 1 "
            "has a total capacty of 79.10 GiB of which 364.31 MiB is free. Process 175080 has "
            "1.46 GiB memory in use. Process 175356 has 77.26 GiB memory in use. Of the allocated "
            "memory 72.12 GiB is allocated by PyTorch, and 3.78 GiB is reserved by PyTorch but "
            "unallocated. If reserved but unallocated memory is large try setting "
            "max_split_size_mb to avoid fragmentation.  See documentation for Memory Management "
            "and PYTORCH_CUDA_ALLOC_CONF"
        ),
        fields=dict(
            wording="pytorch-2.1+",
            device=1,
            tried_bytes=mib(448),
            total_bytes=gib(79.10),
            free_bytes=mib(364.31),
            process_bytes=None,
            allocated_bytes=gib(72.12),
            reserved_bytes=gib(72.12) + gib(3.78),
            other_processes=[(175080, gib(1.46)), (175356, gib(77.26))],
            alloc_conf_hint="max_split_size_mb",
        ),
        first_fix="expandable_segments",
    ),
    dict(  # PyTorch 2.1 with this process's own line; the run is too big for the card
        id="pytorch-2.1-this-process",
        text=(
            "torch.cuda.OutOfMemoryError: CUDA out of memory. Tried to allocate 128.00 MiB. GPU 1 "
            "has a total capacty of 7.79 GiB of which 20.69 MiB is free. Including non-PyTorch "
            "memory, this process has 7.75 GiB memory in use. Of the allocated memory 7.45 GiB is "
            "allocated by PyTorch, and 8.61 MiB is reserved by PyTorch but unallocated. If "
            "reserved but unallocated memory is large try setting max_split_size_mb to avoid "
            "fragmentation."
        ),
        fields=dict(
            device=1,
            total_bytes=gib(7.79),
            free_bytes=mib(20.69),
            process_bytes=gib(7.75),
            allocated_bytes=gib(7.45),
            reserved_bytes=gib(7.45) + mib(8.61),
        ),
        run=dict(model="gpt2", method="full", precision="bf16-mixed", batch_size=8, seq_len=512),
        first_fix="gradient_checkpointing",
    ),
    dict(  # PyTorch 2.2+ (Kaggle): one process listed, which is this one seen from the host
        id="pytorch-2.2-kaggle",
        text=(
            "OutOfMemoryError: CUDA out of memory. Tried to allocate 204.00 MiB. GPU 0 has a "
            "total capacity of 47.53 GiB of which 94.88 MiB is free. Process 1381433 has 47.43 "
            "GiB memory in use. Of the allocated memory 47.03 GiB is allocated by PyTorch, and "
            "83.38 MiB is reserved by PyTorch but unallocated. If reserved but unallocated memory "
            "is large try setting PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True to avoid "
            "fragmentation.  See documentation for Memory Management  "
            "(https://pytorch.org/docs/stable/notes/cuda.html#environment-variables)"
        ),
        fields=dict(
            wording="pytorch-2.1+",
            total_bytes=gib(47.53),
            free_bytes=mib(94.88),
            other_processes=[(1381433, gib(47.43))],
            alloc_conf_hint="PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True",
        ),
        run=dict(model="llama-2-7b", method="lora", precision="bf16", batch_size=16, seq_len=2048),
        first_fix="gradient_checkpointing",
    ),
    dict(  # the newest wording: private pools, another process, the docs.pytorch.org link
        id="pytorch-2.8-other-process",
        text=(
            "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 25.96 GiB. GPU 4 has a "
            "total capacity of 79.18 GiB of which 23.04 GiB is free. Process 7478 has 4.08 GiB "
            "memory in use. Including non-PyTorch memory, this process has 52.02 GiB memory in "
            "use. Of the allocated memory 45.89 GiB is allocated by PyTorch, with 1.38 MiB "
            "allocated in private pools (e.g., CUDA Graphs), and 3.01 GiB is reserved by PyTorch "
            "but unallocated. If reserved but unallocated memory is large try setting "
            "PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True to avoid fragmentation.  See "
            "documentation for Memory Management  (https://docs.pytorch.org/docs/stable/notes/"
            "cuda.html#optimizing-memory-usage-with-pytorch-cuda-alloc-conf)"
        ),
        fields=dict(
            device=4,
            tried_bytes=gib(25.96),
            process_bytes=gib(52.02),
            private_pool_bytes=mib(1.38),
            other_processes=[(7478, gib(4.08))],
            reserved_bytes=gib(45.89) + gib(3.01),
        ),
        first_fix="free_other_process",
    ),
    dict(  # ROCm: HIP, no process lines; loading a model onto a card another process fills
        id="rocm-hip",
        text=(
            "torch.OutOfMemoryError: HIP out of memory. Tried to allocate 978.00 MiB. GPU 0 has a "
            "total capacity of 15.98 GiB of which 630.00 MiB is free. Of the allocated memory 0 "
            "bytes is allocated by PyTorch, and 0 bytes is reserved by PyTorch but unallocated. "
            "If reserved but unallocated memory is large try setting "
            "PYTORCH_HIP_ALLOC_CONF=expandable_segments:True to avoid fragmentation.  See "
            "documentation for Memory Management  "
            "(https://pytorch.org/docs/stable/notes/cuda.html#environment-variables)"
        ),
        fields=dict(
            backend="hip",
            total_bytes=gib(15.98),
            free_bytes=mib(630),
            allocated_bytes=0,
            reserved_bytes=0,
            process_bytes=None,
            alloc_conf_hint="PYTORCH_HIP_ALLOC_CONF=expandable_segments:True",
        ),
        first_fix="free_other_process",
    ),
    dict(  # ROCm build printing the CUDA variable's name; fragmented
        id="rocm-cuda-spelling",
        text=(
            "HIP out of memory. Tried to allocate 2.00 GiB. GPU 0 has a total capacity of 15.98 "
            "GiB of which 512.00 MiB is free. Of the allocated memory 11.20 GiB is allocated by "
            "PyTorch, and 3.10 GiB is reserved by PyTorch but unallocated. If reserved but "
            "unallocated memory is large try setting PYTORCH_CUDA_ALLOC_CONF=expandable_segments:"
            "True to avoid fragmentation."
        ),
        fields=dict(backend="hip", tried_bytes=gib(2), reserved_bytes=gib(11.2) + gib(3.1)),
        first_fix="expandable_segments",
        how="PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True",
    ),
    dict(  # torchrun: every line prefixed with the rank
        id="torchrun-ranks",
        text=(
            "[rank0]: Traceback (most recent call last):\n"
            "[rank0]: torch.OutOfMemoryError: CUDA out of memory.\n"
            "[rank0]: Tried to allocate 16.00 MiB.\n"
            "[rank0]: GPU 0 has a total capacity of 23.56 GiB of which 34.81 MiB is free.\n"
            "[rank0]: Process 26463 has 23.07 GiB memory in use.\n"
            "[rank0]: Of the allocated memory 22.70 GiB is allocated by PyTorch,\n"
            "[rank0]: and 58.17 MiB is reserved by PyTorch but unallocated.\n"
            "torch.distributed.elastic.multiprocessing.errors.ChildFailedError:"
        ),
        fields=dict(
            tried_bytes=mib(16),
            total_bytes=gib(23.56),
            free_bytes=mib(34.81),
            allocated_bytes=gib(22.70),
            wrapped_by=["torchrun"],
        ),
        run=dict(
            model="llama-3.1-8b", method="qlora", precision="bf16", batch_size=2, seq_len=2048
        ),
        first_fix="gradient_checkpointing",
    ),
    dict(  # a Trainer run: the traceback through transformers' trainer.py, then the error
        id="trainer-traceback",
        text=(
            "Traceback (most recent call last):\n"
            '  File "/content/train.py", line 41, in <module>\n    trainer.train()\n'
            '  File "/usr/local/lib/python3.12/dist-packages/transformers/trainer.py", line 2245,'
            " in train\n    return inner_training_loop(\n"
            '  File "/usr/local/lib/python3.12/dist-packages/transformers/trainer.py", line 2560,'
            " in _inner_training_loop\n    tr_loss_step = self.training_step(model, inputs, "
            "num_items_in_batch)\n"
            "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 1002.00 MiB. GPU 0 has "
            "a total capacity of 14.74 GiB of which 382.12 MiB is free. Process 2571 has 14.36 "
            "GiB memory in use. Of the allocated memory 13.97 GiB is allocated by PyTorch, and "
            "262.21 MiB is reserved by PyTorch but unallocated. If reserved but unallocated "
            "memory is large try setting PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True to "
            "avoid fragmentation."
        ),
        fields=dict(tried_bytes=mib(1002), total_bytes=gib(14.74), wrapped_by=["Trainer"]),
        run=dict(
            model="llama-3.2-1b", method="full", precision="bf16-mixed", batch_size=8, seq_len=1024
        ),
        first_fix="lora",
    ),
    dict(  # Trainer(auto_find_batch_size=True): accelerate halved the batch down to zero
        id="auto-find-batch-size",
        text=(
            "Decreasing batch size to 2.\nDecreasing batch size to 1.\nTraceback (most recent "
            'call last):\n  File "accelerate/utils/memory.py", line 174, in decorator\n'
            "RuntimeError: No executable batch size found, reached zero."
        ),
        fields=dict(wording="batch-search", last_batch_size=1, wrapped_by=["auto_find_batch_size"]),
        run=dict(model="llama-3.2-3b", method="lora", precision="bf16", batch_size=8, seq_len=2048),
        gpu="T4",
        first_fix="gradient_checkpointing",
    ),
    dict(  # Apple MPS, binary units written GiB
        id="mps",
        text=(
            "RuntimeError: MPS backend out of memory (MPS allocated: 14.29 GiB, other "
            "allocations: 3.65 GiB, max allowed: 20.13 GiB). Tried to allocate 2.67 GiB on "
            "shared pool. Use PYTORCH_MPS_HIGH_WATERMARK_RATIO=0.0 to disable upper limit for "
            "memory allocations (may cause system failure)."
        ),
        fields=dict(
            backend="mps",
            allocated_bytes=gib(14.29),
            mps_other_bytes=gib(3.65),
            total_bytes=gib(20.13),
            tried_bytes=gib(2.67),
        ),
        run=dict(model="llama-3.2-3b", method="lora", precision="bf16", batch_size=2, seq_len=2048),
        first_fix="gradient_checkpointing",
    ),
    dict(  # older MPS: the same binary units written GB
        id="mps-gb",
        text=(
            "MPS backend out of memory (MPS allocated: 42.33 GB, other allocations: 3.00 GB, max "
            "allowed: 45.90 GB). Tried to allocate 3.00 GB on private pool."
        ),
        fields=dict(backend="mps", total_bytes=gib(45.90), tried_bytes=gib(3)),
    ),
    dict(  # the driver, outside the caching allocator: no figures
        id="driver",
        text=(
            "RuntimeError: CUDA error: out of memory\nCUDA kernel errors might be asynchronously "
            "reported at some other API call, so the stacktrace below might be incorrect."
        ),
        fields=dict(wording="driver", tried_bytes=None, total_bytes=None),
    ),
    dict(  # Windows (no NVML process lines), "0 bytes is free"
        id="windows-no-processes",
        text=(
            "CUDA out of memory. Tried to allocate 730.00 MiB. GPU 0 has a total capacity of 8.00 "
            "GiB of which 0 bytes is free. Of the allocated memory 6.52 GiB is allocated by "
            "PyTorch, and 666.27 MiB is reserved by PyTorch but unallocated."
        ),
        fields=dict(free_bytes=0, total_bytes=gib(8), reserved_bytes=gib(6.52) + mib(666.27)),
        run=dict(model="gpt2", method="full", precision="bf16-mixed", batch_size=8, seq_len=1024),
        first_fix="gradient_checkpointing",
    ),
]


@pytest.mark.parametrize("case", CORPUS, ids=[c["id"] for c in CORPUS])
def test_real_messages_are_read_field_by_field(case):
    message = parse_oom(case["text"])
    assert message is not None
    for name, expected in case["fields"].items():
        got = getattr(message, name)
        if isinstance(expected, int) and name.endswith("_bytes") and expected:
            # PyTorch prints two decimals: the figure is exact to its last digit
            assert abs(got - expected) <= 0.006 * (GiB if expected >= GiB else MiB), (name, got)
        elif name == "other_processes":
            assert [pid for pid, _ in got] == [pid for pid, _ in expected]
            assert all(abs(a[1] - b[1]) < 0.01 * GiB for a, b in zip(got, expected, strict=True))
        else:
            assert got == expected, (name, got, expected)


@pytest.mark.parametrize(
    "case",
    [c for c in CORPUS if "first_fix" in c],
    ids=[c["id"] for c in CORPUS if "first_fix" in c],
)
def test_the_first_fix_for_each_message(case):
    run = dict(case.get("run", {}))
    diagnosis = oom_doctor(case["text"], gpu=case.get("gpu"), **run)
    assert diagnosis.recognized and not diagnosis.problems, str(diagnosis)
    first = diagnosis.first_fix
    assert first is not None and first.key == case["first_fix"], str(diagnosis)
    if "how" in case:
        assert case["how"] in first.how
    if first.report is not None:  # a change of the run: its peak fits what the card offered
        assert first.peak_bytes == first.report.total_bytes
        assert first.spare_bytes >= 0 and first.peak_bytes <= diagnosis.budget_bytes
        settings = {k: v for k, v in run.items() if k != "model"}
        if diagnosis.message.wording == "batch-search":
            settings["batch_size"] = 1  # Trainer already halved it down to one
        again = lessonkit.estimate(run["model"], **{**settings, **first.change})
        assert again.total_bytes == first.peak_bytes
        assert diagnosis.report.total_bytes > first.peak_bytes


def test_the_budget_is_what_this_process_held_plus_what_was_free():
    case = next(c for c in CORPUS if c["id"] == "pytorch-2.8-other-process")
    d = oom_doctor(
        case["text"], model="7B", method="qlora", precision="bf16", batch_size=4, seq_len=2048
    )
    m = d.message
    others = m.total_bytes - (m.free_bytes + m.process_bytes)  # 4.08 GiB listed, and the driver's
    assert abs(others - m.other_processes[0][1]) < 0.1 * GiB
    assert any(f"Another process held about {others / GiB:.2f} GiB" in f for f in d.findings)
    # the card the catalog knows by that total: its one usable figure, less what others held
    assert d.card is not None and abs(d.card.usable_bytes - m.total_bytes) < 0.001 * m.total_bytes
    assert d.budget_bytes == d.card.usable_bytes - others
    # a container lists this process by id: the one holding at least PyTorch's reserve is ours
    case = next(c for c in CORPUS if c["id"] == "pytorch-2.1-processes")
    d = oom_doctor(case["text"])
    assert d.budget_bytes == d.message.free_bytes + d.message.other_processes[1][1]
    assert not any("Another process" in f for f in d.findings)  # 1.46 GiB of 79: not large


def test_fixes_are_ranked_cheapest_first_and_each_fits():
    text = next(c for c in CORPUS if c["id"] == "pytorch-2.1-this-process")["text"]
    d = oom_doctor(
        text, model="gpt2", method="full", precision="bf16-mixed", batch_size=16, seq_len=1024
    )
    keys = [f.key for f in d.fixes]
    assert len(keys) == len(set(keys)) >= 3, keys
    order = [
        "gradient_checkpointing",
        "8bit_optimizer",
        "precision",
        "smaller_micro_batch",
        "shorter_sequence",
        "lora",
        "qlora",
        "offload_optimizer",
        "more_gpus",
    ]
    assert keys == sorted(keys, key=order.index)
    assert all(f.peak_bytes <= d.budget_bytes for f in d.fixes)
    assert (
        "gradient_accumulation_steps"
        in next(f.how for f in d.fixes if f.key == "smaller_micro_batch")
        or "smaller_micro_batch" not in keys
    )


def test_a_run_that_fits_on_paper_points_at_what_else_holds_memory():
    text = next(c for c in CORPUS if c["id"] == "pytorch-2.1-this-process")["text"]
    d = oom_doctor(
        text, model="gpt2", method="full", precision="bf16-mixed", batch_size=1, seq_len=128
    )
    assert d.report.total_bytes < d.budget_bytes
    assert any("above the estimate" in f for f in d.findings), d.findings


def test_the_same_run_from_the_objects_a_learner_has(tmp_path):
    from peft import LoraConfig
    from transformers import BitsAndBytesConfig, LlamaConfig, TrainingArguments

    args = TrainingArguments(
        output_dir=str(tmp_path),
        per_device_train_batch_size=8,
        gradient_accumulation_steps=2,
        bf16=True,
        use_cpu=True,
        report_to=[],
        optim="paged_adamw_8bit",
    )
    lora = LoraConfig(r=16, target_modules=["q_proj", "v_proj"])
    bnb = BitsAndBytesConfig(
        load_in_4bit=True, bnb_4bit_quant_type="nf4", bnb_4bit_use_double_quant=True
    )
    spec = lessonkit.get_preset("llama-2-7b")
    config = LlamaConfig(
        hidden_size=spec.hidden_size,
        intermediate_size=spec.intermediate_size,
        num_hidden_layers=spec.n_layers,
        num_attention_heads=spec.n_heads,
        vocab_size=spec.vocab_size,
    )
    text = next(c for c in CORPUS if c["id"] == "pytorch-2.1-this-process")["text"]
    from_objects = oom_doctor(text, args, lora, bnb, model=config, seq_len=1024)
    direct = oom_doctor(
        text,
        model="llama-2-7b",
        method="qlora",
        precision="bf16",
        optimizer="paged-adamw-8bit",
        batch_size=8,
        gradient_accumulation=2,
        seq_len=1024,
    )
    assert from_objects.report.total_bytes == direct.report.total_bytes
    assert [f.key for f in from_objects.fixes] == [f.key for f in direct.fixes]
    assert any("TrainingArguments" in n for n in from_objects.notes)


def test_a_trainer_is_read_without_touching_its_weights(tmp_path):
    import torch
    from transformers import GPT2Config, GPT2LMHeadModel, Trainer, TrainingArguments

    model = GPT2LMHeadModel(GPT2Config(n_layer=2, n_embd=64, n_head=2, vocab_size=1000))
    args = TrainingArguments(
        output_dir=str(tmp_path),
        per_device_train_batch_size=4,
        activation_checkpointing=True,
        use_cpu=True,
        report_to=[],
    )
    trainer = Trainer(model=model, args=args)
    before = [p.detach().clone() for p in model.parameters()]
    from lessonkit.planning.training_objects import describe_run

    run = describe_run(trainer, seq_len=256)
    assert run.model["model_type"] == "gpt2" and run.model["n_layer"] == 2
    assert run.settings["batch_size"] == 4 and run.settings["gradient_checkpointing"] is True
    assert run.settings["precision"] == "fp32"  # an fp32 model without bf16/fp16 flags
    assert all(torch.equal(a, b) for a, b in zip(before, model.parameters(), strict=True))


ODD = [
    None,
    0,
    -1,
    1e308,
    float("nan"),
    "",
    " ",
    "out of memory",
    b"\xff\xfe",
    object(),
    ["CUDA out of memory"],
    {"text": 1},
    "CUDA out of memory. Tried to allocate",
    "CUDA out of memory. Tried to allocate 99999999999999999999 GiB.",
    "x" * 3_000_000,
    "CUDA out of memory. " * 20000,
    ValueError("no"),
    "HIP out of memory. GPU -1 has a total capacity of nan GiB",
]


class Unprintable(Exception):
    def __str__(self) -> str:
        raise RuntimeError("cannot print")


@pytest.mark.parametrize("odd", [*ODD, Unprintable()], ids=lambda o: type(o).__name__)
def test_odd_input_never_raises(odd):
    def diagnose():
        d = oom_doctor(odd)
        assert isinstance(str(d), str) and isinstance(d.to_dict(), dict)
        return d

    d, calls = count_calls(diagnose)
    if not d.recognized:
        assert "not an out-of-memory message I know" in str(d)
    # Work, not seconds (benchmarks/ time things): 20,000 repeated messages take about 40,000
    # calls; a pass over the text per line or per match would take millions.
    assert calls < 100_000, calls


@pytest.mark.parametrize(
    "settings",
    [
        dict(model=object()),
        dict(model="nosuch-model"),
        dict(model="7B", batch_size="lots"),
        dict(model="7B", method="sideways"),
        dict(model="7B", gpu=42),
        dict(model="7B", gpu="T5"),
        dict(model="7B", unknown_setting=1),
        dict(model={"model_type": "bert"}),
        dict(model="7B", seq_len=-4),
    ],
)
def test_odd_settings_never_raise_and_say_what_was_wrong(settings):
    text = CORPUS[2]["text"]
    d = oom_doctor(text, **settings)
    assert d.recognized
    said = " ".join(d.problems + d.notes)
    assert said, str(d)


def test_an_unknown_message_says_what_was_expected():
    d = oom_doctor("KeyError: 'input_ids'")
    assert not d.recognized and d.fixes == []
    assert "Tried to allocate" in str(d) and "HIP out of memory" in str(d)


def test_watch_prints_the_diagnosis_and_reraises_the_same_error(capsys):
    error = RuntimeError(CORPUS[2]["text"])
    with (
        pytest.raises(RuntimeError) as raised,
        oom_doctor.watch(model="gpt2", batch_size=8, seq_len=512),
    ):
        raise error
    assert raised.value is error
    out = capsys.readouterr().out
    assert "lessonkit.oom_doctor" in out and "Gradient checkpointing" in out
    with pytest.raises(KeyError), oom_doctor.watch(model="7B"):  # passes untouched, silently
        raise KeyError("input_ids")
    assert capsys.readouterr().out == ""


def test_watch_catches_torchs_own_out_of_memory_error(capsys):
    torch = pytest.importorskip("torch")
    with pytest.raises(torch.OutOfMemoryError), oom_doctor.watch():
        raise torch.OutOfMemoryError(CORPUS[4]["text"].split(": ", 1)[1])
    assert "Another process held" in capsys.readouterr().out


def _cli(*args: str, stdin: str | None = None) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "lessonkit", "oom", *args],
        input=stdin,
        capture_output=True,
        text=True,
        timeout=120,
        cwd=ROOT,
    )


def test_cli_reads_the_message_as_an_argument_or_from_stdin():
    text = CORPUS[2]["text"]
    run = ["--model", "gpt2", "--batch-size", "8", "--seq-len", "512"]
    argument = _cli(text, *run)
    piped = _cli(*run, stdin="some log line\n" + text + "\n")
    assert argument.returncode == 0 and piped.returncode == 0, argument.stderr
    assert argument.stdout == piped.stdout
    assert "1. Gradient checkpointing" in argument.stdout
    assert "--gradient-checkpointing" in argument.stdout


def test_cli_exit_codes():
    assert _cli("not an error at all").returncode == 1
    assert _cli(CORPUS[2]["text"], "--model", "nosuch").returncode == 2
    json_out = _cli(CORPUS[0]["text"], "--json")
    assert json_out.returncode == 0 and '"first' not in json_out.stderr
    import json

    data = json.loads(json_out.stdout)
    assert data["recognized"] and data["fixes"][0]["key"] == "free_other_process"


def test_readme_oom_example_runs_and_the_function_is_named():
    import shlex

    readme = (ROOT / "README.md").read_text()
    line = next(text for text in readme.splitlines() if text.startswith("lessonkit oom "))
    result = _cli(*shlex.split(line)[2:])
    assert result.returncode == 0, result.stderr
    assert "1. " in result.stdout and "estimated peak per GPU" in result.stdout
    assert "lessonkit.oom_doctor(error" in readme and "charts.memory_timeline(report)" in readme


@pytest.mark.gpu
def test_a_real_cuda_out_of_memory_error_is_read():
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA GPU")
    total = torch.cuda.get_device_properties(0).total_memory
    with pytest.raises(torch.OutOfMemoryError) as raised:
        torch.empty(2 * total, dtype=torch.uint8, device="cuda")
    message = parse_oom(raised.value)
    assert message is not None and message.backend in ("cuda", "hip")
    assert abs(message.total_bytes - total) <= 0.006 * GiB
    assert abs(message.tried_bytes - 2 * total) <= 0.006 * GiB  # printed to 0.01 GiB
    d = oom_doctor(raised.value, model="7B", batch_size=1, seq_len=512)
    assert d.recognized and d.budget_bytes <= total


@pytest.mark.parametrize(
    ("change", "key", "words"),
    [
        ({"loss": "chunked"}, "loss", "CEWithChunkedOutputLoss"),
        ({"optimizer_in_backward": True}, "optimizer_in_backward", "optimizer_in_bwd"),
        (
            {"gradient_checkpointing": True, "activation_offload": True},
            "activation_offload",
            "activation_offloading=True",
        ),
        ({"no_sync": False}, "no_sync", "sync_each_batch"),
    ],
)
def test_each_memory_saver_is_named_as_itself(change, key, words):
    """A saver's fix says what it is and how to turn it on, not 'Gradient checkpointing'."""
    from lessonkit.planning.oom import _fix_from_change

    fix = _fix_from_change(change, lessonkit.estimate("gpt2"), 10**11)
    assert fix.key == key and words in fix.how and fix.title != "Gradient checkpointing"


def test_the_trainer_settings_the_fixes_name_exist(tmp_path):
    transformers = pytest.importorskip("transformers")
    args = transformers.TrainingArguments(
        output_dir=str(tmp_path),
        use_cpu=True,
        report_to=[],
        accelerator_config={"gradient_accumulation_kwargs": {"sync_each_batch": True}},
    )
    assert args.accelerator_config.gradient_accumulation_kwargs == {"sync_each_batch": True}


@pytest.mark.parametrize("sync_each_batch", [None, True])
def test_fsdp_trainer_arguments_keep_full_gradients_unless_synced_each_batch(
    sync_each_batch, tmp_path
):
    """Under FSDP with accumulation the Trainer reduces only on the last micro-batch
    (Accelerate's sync_each_batch=False): read from TrainingArguments, that is no_sync=True."""
    from transformers import TrainingArguments

    from lessonkit.planning.training_objects import describe_run

    extra = (
        {}
        if sync_each_batch is None
        else {
            "accelerator_config": {
                "gradient_accumulation_kwargs": {"sync_each_batch": sync_each_batch}
            }
        }
    )
    args = TrainingArguments(
        output_dir=str(tmp_path),
        per_device_train_batch_size=2,
        gradient_accumulation_steps=4,
        bf16=True,
        use_cpu=True,
        report_to=[],
        fsdp="full_shard",
        **extra,
    )
    run = describe_run(args, model="llama-2-7b", n_gpus=8)
    assert run.settings["zero_stage"] == 3
    assert run.settings.get("no_sync", False) is (sync_each_batch is None)
    one_gpu = describe_run(args, model="llama-2-7b")
    assert "no_sync" not in one_gpu.settings and any("n_gpus=" in n for n in one_gpu.notes)
    lessonkit.estimate(run.model, **run.settings)  # a valid run either way
