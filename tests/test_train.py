"""Tests for jetflow/training/ (config, step, run, train) on a tiny random Llama target: loss pieces against
loop references, a fixed batch that trains, exact resume, evaluation arithmetic, provenance and the CLI."""
import dataclasses
import json
import math
import shlex

import pytest
import torch
import torch.nn.functional as F
from safetensors.torch import load_file

from jetflow.cli import build_parser, main
from jetflow.commands import train_config
from jetflow.drafting.head import DraftHead
from jetflow.engine.target import Target
from jetflow.engine.metrics import simulated_tau
from jetflow.training import objective
from jetflow.training.objective import (curriculum_weights, depth_accuracy, depth_weights, masked_mean, slot_losses, slot_targets,
                               weighted_ce)
from jetflow.training.train import build_head, draft_vocabulary, train
from jetflow.training.step import BlockForward, anchors_at, evaluate, head_compute, lr_factor, sample_anchors, sequence_loss
from jetflow.training.config import TrainConfig, command_for
from fakes import ByteTokenizer, tiny_model

V = 211


@pytest.fixture(scope="module")
def target():
    return Target(tiny_model("llama", V, seed=3), ByteTokenizer(), "tiny-llama-211")


def fake_rows(n=5, seed=0):
    g = torch.Generator().manual_seed(seed)
    return [{"id": f"src{i % 2}:{i}", "prompt_ids": torch.randint(0, V - 1, (6 + i,), generator=g).tolist(),
             "response_ids": torch.randint(0, V - 1, (14 + 3 * i,), generator=g).tolist()} for i in range(n)]


@pytest.fixture
def data(tmp_path):
    path = tmp_path / "regen.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in fake_rows()))
    return path


def smoke(data, out, **kw) -> TrainConfig:
    return TrainConfig.from_name("smoke", data=str(data), out=str(out), block_size=5, **kw)


# ----------------------------------------------------------------------------- pure pieces
@pytest.mark.parametrize("gamma", [0.0, 1.0, 7.0])
def test_depth_weights_follow_gamma(gamma):
    w = depth_weights(6, gamma)
    expected = [1.0 if gamma == 0 else math.exp(-(k - 1) / gamma) for k in range(1, 7)]
    torch.testing.assert_close(w, torch.tensor(expected))


def test_slot_targets_match_loop():
    anchors, seq_len, n = torch.tensor([3, 7, 9]), 11, 5
    pos, valid = slot_targets(anchors, seq_len, n)
    for b, a in enumerate(anchors.tolist()):
        for k in range(1, n):
            assert bool(valid[b, k - 1]) == (a + k < seq_len)
            if a + k < seq_len:
                assert int(pos[b, k - 1]) == a + k


def test_loss_ignores_slots_past_the_end():
    """Garbage (NaN) logits at invalid slots change nothing; the mean is the loop's weighted mean."""
    torch.manual_seed(0)
    anchors, seq_len, n = torch.tensor([2, 8]), 10, 5
    ids, (pos, valid) = torch.randint(0, V, (seq_len,)), slot_targets(anchors, seq_len, n)
    logits = torch.randn(2, n - 1, V)
    logits[~valid] = float("nan")
    w = depth_weights(n - 1, 2.0)
    loss = masked_mean(slot_losses(logits, pos, "ce", ids), valid, w)
    num = den = 0.0
    for b, a in enumerate(anchors.tolist()):
        for k in range(1, n):
            if a + k < seq_len:
                nll = -torch.log_softmax(logits[b, k - 1], -1)[ids[a + k]]
                num, den = num + w[k - 1] * nll, den + w[k - 1]
    torch.testing.assert_close(loss, num / den)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("chunk", [2, 128])
def test_weighted_ce_of_the_valid_slots_is_the_masked_mean(dtype, chunk, monkeypatch):
    """The loss over the gathered valid slots (chunked, fused backward) = masked_mean over all A*D slots:
    value and gradient, whatever the chunk size and the logits' dtype."""
    monkeypatch.setattr(objective, "CE_ROWS", chunk)
    torch.manual_seed(0)
    anchors, seq_len, n = torch.tensor([2, 5, 8]), 10, 5
    ids, (pos, valid) = torch.randint(0, V, (seq_len,)), slot_targets(anchors, seq_len, n)
    logits = (3 * torch.randn(3, n - 1, V)).to(dtype).requires_grad_()
    w = depth_weights(n - 1, 2.0)
    ref = masked_mean(slot_losses(logits, pos, "ce", ids), valid, w)
    (g_ref,) = torch.autograd.grad(ref, logits)
    loss = weighted_ce(logits[valid], ids[pos][valid], w.expand_as(valid)[valid])
    (g,) = torch.autograd.grad(loss, logits)
    torch.testing.assert_close(loss, ref, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(g.float(), g_ref.float(), atol=1e-5 if dtype == torch.float32 else 1e-3, rtol=1e-2)
    assert g.dtype == dtype and not g[~valid].any()
    assert weighted_ce(logits[:0, 0], ids[:0], w[:0]) == 0  # no valid slot: a zero loss, not NaN


def test_kl_matches_reference_and_vanishes_for_the_teacher():
    torch.manual_seed(0)
    teacher, anchors = torch.randn(12, V), torch.tensor([1, 4, 6])
    ids, (pos, _) = torch.randint(0, V, (12,)), slot_targets(anchors, 12, 5)
    logits = torch.randn(3, 4, V)
    ref = F.kl_div(torch.log_softmax(logits, -1), torch.log_softmax(teacher[pos - 1], -1), log_target=True,
                   reduction="none").sum(-1)
    torch.testing.assert_close(slot_losses(logits, pos, "kl", ids, teacher), ref, atol=1e-5, rtol=1e-5)
    assert slot_losses(teacher[pos - 1], pos, "kl", ids, teacher).abs().max() < 1e-5


def test_anchors_lie_in_the_response_and_are_reproducible():
    g = lambda: torch.Generator().manual_seed(1)  # noqa: E731
    a = sample_anchors(5, 20, 8, g())
    assert torch.equal(a, sample_anchors(5, 20, 8, g())) and a.unique().numel() == 8
    assert a.min() >= 5 and a.max() <= 18
    assert sample_anchors(5, 9, 8, g()).tolist() == [5, 6, 7]  # fewer available than asked
    cfg = TrainConfig(anchors_per_seq=4)
    drawn = {(pos, seed): anchors_at(pos, 5, 30, dataclasses.replace(cfg, seed=seed)) for pos in range(6)
             for seed in (0, 1)}
    for a in drawn.values():  # response tokens with a successor: prompt_len .. seq_len - 2
        assert a.numel() == 4 and a.unique().numel() == 4 and a.min() >= 5 and a.max() <= 28
    assert len({tuple(a.tolist()) for a in drawn.values()}) > 8  # they move with position and with seed
    assert not torch.equal(drawn[3, 0], drawn[3, 1]) and not torch.equal(drawn[3, 0], drawn[4, 0])


def test_lr_schedule_warms_up_then_decays_to_zero():
    f = [lr_factor(s, 100, 0.1) for s in range(100)]
    assert f[0] == pytest.approx(0.1) and f[9] == pytest.approx(1.0)
    assert all(a >= b for a, b in zip(f[9:], f[10:])) and lr_factor(100, 100, 0.1) == pytest.approx(0.0)


def test_depth_accuracy_counts_valid_slots_only():
    pred = torch.tensor([[1, 2, 3], [1, 9, 9]])
    truth = torch.tensor([[1, 2, 0], [1, 2, 3]])
    valid = torch.tensor([[True, True, True], [True, True, False]])
    correct, count = depth_accuracy(pred, truth, valid)
    assert correct.tolist() == [2, 1, 0] and count.tolist() == [2, 2, 1]


# ----------------------------------------------------------------------------- training
@pytest.mark.parametrize("causal", [True, False])
def test_steps_lower_the_loss_on_a_fixed_batch(target, causal):
    cfg = TrainConfig(causal=causal, block_size=5, anchors_per_seq=6, init="random")
    head = build_head(cfg, target)
    blocks, opt = BlockForward(head), torch.optim.AdamW(head.parameters(), lr=3e-3, weight_decay=0.0)
    batch = [(torch.tensor(r["prompt_ids"] + r["response_ids"]), len(r["prompt_ids"])) for r in fake_rows(2)]
    batch = [(ids, p, sample_anchors(p, ids.numel(), 6, torch.Generator().manual_seed(0))) for ids, p in batch]
    losses = []
    for _ in range(15):
        loss = sum(sequence_loss(blocks, target, ids, a, cfg)[0] for ids, p, a in batch) / len(batch)
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(loss.item())
    assert losses[-1] < 0.8 * losses[0]
    assert all(p.grad is None for p in target.model.parameters())  # nothing flows into the target


BF16_LOSS_RTOL = 1e-2  # bf16 keeps 8 mantissa bits; one sequence's loss moves well under 1% (measured ~0.1%)


@pytest.mark.parametrize("causal", [True, False])
def test_bf16_blockwise_step_gives_the_fp32_packed_loss_within_tolerance(target, causal):
    """The fast training step (bf16 autocast, blockwise attention) against the fp32 packed one on the same
    batch: the loss within BF16_LOSS_RTOL, the gradients pointing the same way; fp32 blockwise exactly."""
    ref_cfg = TrainConfig(causal=causal, block_size=5, loss="ce", precision="float32", attention="packed")
    head = build_head(ref_cfg, target)
    (ids, p), = [(torch.tensor(r["prompt_ids"] + r["response_ids"]), len(r["prompt_ids"])) for r in fake_rows(1)]
    anchors = sample_anchors(p, ids.numel(), 8, torch.Generator().manual_seed(0))
    out = {}
    for precision, attention in [("float32", "packed"), ("float32", "blocks"), ("bfloat16", "blocks")]:
        cfg = dataclasses.replace(ref_cfg, precision=precision, attention=attention)
        head.zero_grad()
        loss, slots = sequence_loss(BlockForward(head), target, ids, anchors, cfg)
        loss.backward()
        out[precision, attention] = loss.item(), torch.cat([q.grad.flatten() for q in head.parameters()]), slots
    ref_loss, ref_grad, ref_slots = out["float32", "packed"]
    assert out["float32", "blocks"][0] == pytest.approx(ref_loss, rel=1e-6)
    loss, grad, slots = out["bfloat16", "blocks"]
    assert slots == ref_slots and loss == pytest.approx(ref_loss, rel=BF16_LOSS_RTOL) and loss != ref_loss
    assert F.cosine_similarity(grad, ref_grad, dim=0) > 0.99


def test_auto_precision_and_attention_follow_the_device(monkeypatch):
    import jetflow.training.step as tr
    auto = TrainConfig()
    monkeypatch.setattr(tr, "fast_dtype", lambda device: ("bfloat16", "native"))
    assert head_compute(auto, "cpu") == (torch.bfloat16, True)
    monkeypatch.setattr(tr, "fast_dtype", lambda device: ("float32", "emulated"))
    assert head_compute(auto, "cpu") == (torch.float32, True)
    assert head_compute(dataclasses.replace(auto, precision="bfloat16", attention="packed"), "cpu") == (torch.bfloat16, False)
    assert head_compute(auto, "cuda")[1] is False  # GPUs: the fused packed kernel


def test_evaluate_reports_every_depth(target):
    head = build_head(TrainConfig(block_size=5), target)
    seqs = [(torch.tensor(r["prompt_ids"] + r["response_ids"]), len(r["prompt_ids"])) for r in fake_rows(2)]
    ev = evaluate(head, target, seqs, stride=2, chunk=3)
    assert len(ev["acc"]) == 4 and all(0 <= a <= 1 for a in ev["acc"])
    assert ev["sim_tau"] == pytest.approx(simulated_tau(ev["acc"]))
    assert ev == evaluate(head, target, seqs, stride=2, chunk=64)  # chunking changes nothing


def test_resume_matches_an_uninterrupted_run(target, data, tmp_path):
    straight, _ = train(smoke(data, tmp_path / "a"), target, progress=False)
    train(smoke(data, tmp_path / "b"), target, stop_at=2, progress=False)
    state = json.loads((tmp_path / "b" / "checkpoint" / "train_state.json").read_text())
    assert state["step"] == 2 and state["data_position"] == 4
    resumed, history = train(smoke(data, tmp_path / "b"), target, progress=False)
    assert [h["step"] for h in history] == [0, 1, 2, 3, 4]
    for (name, a), b in zip(straight.state_dict().items(), resumed.state_dict().values()):
        torch.testing.assert_close(a, b, atol=1e-6, rtol=0, msg=name)
    lines = (tmp_path / "b" / "history.jsonl").read_text().splitlines()
    assert [json.loads(x)["step"] for x in lines] == [0, 1, 2, 3, 4]
    again, history = train(smoke(data, tmp_path / "b"), target, progress=False)  # finished: nothing to do
    assert len(history) == 5 and torch.equal(again.fc.weight, resumed.fc.weight)


def test_resume_refuses_another_config(target, data, tmp_path):
    out = tmp_path / "run"
    train(smoke(data, out), target, stop_at=2, progress=False)
    with pytest.raises(ValueError, match="gamma"):
        train(smoke(data, out, gamma=3.0), target, progress=False)


def test_a_checkpoint_from_before_the_precision_fields_resumes_as_it_trained(target, data, tmp_path):
    """Checkpoints written before ``precision`` and ``attention`` existed trained in fp32, packed: they
    resume under those settings and refuse the new defaults by name."""
    out = tmp_path / "run"
    old = smoke(data, out, precision="float32", attention="packed")
    train(old, target, stop_at=2, progress=False)
    path = out / "checkpoint" / "train_state.json"
    state = json.loads(path.read_text())
    del state["config"]["precision"], state["config"]["attention"]
    path.write_text(json.dumps(state))
    with pytest.raises(ValueError, match="attention.*precision"):
        train(smoke(data, out), target, progress=False)
    assert [h["step"] for h in train(old, target, progress=False)[1]] == [0, 1, 2, 3, 4]


def test_resume_identifies_the_data_by_content_not_path(target, data, tmp_path):
    out = tmp_path / "run"
    train(smoke(data, out), target, stop_at=2, progress=False)
    moved = tmp_path / "moved" / "renamed.jsonl"
    moved.parent.mkdir()
    data.rename(moved)
    _, history = train(smoke(moved, out), target, stop_at=3, progress=False)  # same bytes elsewhere: resumes
    assert history[-1]["step"] == 3
    moved.write_text("".join(json.dumps(r) + "\n" for r in fake_rows(seed=1)))  # same path, other data
    with pytest.raises(ValueError, match="trained on other data"):
        train(smoke(moved, out), target, progress=False)


def test_outputs_and_provenance(target, data, tmp_path):
    cfg = smoke(data, tmp_path / "run", gamma=2.0)
    data.with_name(data.name + ".meta.json").write_text(json.dumps({"command": "python -m jetflow regenerate --n 5"}))
    head, history = train(cfg, target, progress=False)
    out = tmp_path / "run"
    assert DraftHead.from_pretrained(str(out)).config == head.config
    assert load_file(str(out / "model.safetensors"))["fc.weight"].dtype == torch.bfloat16
    prov = json.loads((out / "provenance.json").read_text())
    assert prov["command"] == command_for(cfg) and "--gamma 2.0" in prov["command"]
    assert prov["steps"] == 4 and prov["seed"] == 0 and prov["config"]["gamma"] == 2.0
    assert prov["data"]["sequences"] == 5 and prov["data"]["eval_sequences"] == 1
    assert prov["data"]["mix"] == {"src0": 3, "src1": 2}
    assert prov["final"]["acc"] == history[-1]["acc"] and prov["final"]["sim_tau"] == history[-1]["sim_tau"]
    assert prov["tokens"]["supervised_slots"] > 0 and "torch" in prov["versions"]
    md = (out / "PROVENANCE.md").read_text()
    assert prov["command"] in md and prov["data"]["sha256"] in md
    assert prov["data"]["command"] == "python -m jetflow regenerate --n 5" and prov["data"]["command"] in md


def test_command_rebuilds_the_config(data, tmp_path):
    cfg = dataclasses.replace(smoke(data, tmp_path), causal=False, lr=2e-3, max_len=64, init="random")
    argv = shlex.split(command_for(cfg))
    assert argv[:4] == ["python", "-m", "jetflow", "train"] and "--bidirectional" in argv
    args = build_parser().parse_args(argv[3:])
    assert train_config(args) == dataclasses.replace(cfg, data=args.data, out=args.out)


def test_cli_missing_data_is_a_clear_error(tmp_path, capsys):
    assert main(["train", "--data", str(tmp_path / "nope.jsonl"), "--out", str(tmp_path / "o")]) == 2
    assert "error:" in capsys.readouterr().err


@pytest.mark.parametrize("extra", [["--set", "max_len"], ["--set", "nope=1"], ["--set", "causal=maybe"],
                                   ["--preset", "huge"]])
def test_cli_bad_arguments_are_clear_errors(data, tmp_path, capsys, extra):
    assert main(["train", "--data", str(data), "--out", str(tmp_path / "o"), *extra]) == 2
    assert "error:" in capsys.readouterr().err


@pytest.mark.parametrize("bad", [dict(loss="mse"), dict(steps=0), dict(gamma=-1.0), dict(init="zeros"),
                                 dict(precision="fp8"), dict(attention="flash")])
def test_bad_config_is_rejected(bad):
    with pytest.raises(ValueError):
        TrainConfig(**bad)


def test_curriculum_moves_from_gamma_start_to_gamma():
    cfg = TrainConfig.from_name("smoke", steps=100, gamma=0.0, gamma_start=0.5, curriculum=0.5)
    assert torch.allclose(curriculum_weights(4, cfg, 0), depth_weights(4, 0.5))
    assert torch.allclose(curriculum_weights(4, cfg, 25), 0.5 * depth_weights(4, 0.5) + 0.5 * torch.ones(4))
    assert torch.allclose(curriculum_weights(4, cfg, 50), torch.ones(4))
    assert torch.allclose(curriculum_weights(4, cfg, 99), torch.ones(4))
    plain = TrainConfig.from_name("smoke", gamma=7.0)
    assert torch.allclose(curriculum_weights(4, plain, 0), depth_weights(4, 7.0))


# ----------------------------------------------------------------------------- draft vocabulary
def test_draft_vocabulary_ranks_response_tokens_by_frequency():
    rows = [{"prompt_ids": [9, 9, 9], "response_ids": [5, 5, 7, 3, 7, 5]}, {"prompt_ids": [], "response_ids": [3, 8]}]
    assert draft_vocabulary(rows, 3).tolist() == [5, 3, 7]            # 5 x3, then 3 and 7 x2 (lower id first)
    assert draft_vocabulary(rows, 3, always=(8,)).tolist() == [8, 5, 3]
    assert draft_vocabulary(rows, 6).tolist() == [5, 3, 7, 8, 0, 1]   # prompt tokens never count; padded


def test_draft_vocab_head_trains_saves_and_skips_unknown_tokens(target, data, tmp_path):
    cfg = smoke(data, tmp_path / "run", draft_vocab=40, loss="ce")
    rows = [json.loads(x) for x in data.read_text().splitlines()]
    head, history = train(cfg, target, progress=False)
    assert head.vocab.tolist() == draft_vocabulary(rows[:-cfg.eval_seqs], 40, sorted(target.eos_ids)).tolist()
    loaded = DraftHead.from_pretrained(str(tmp_path / "run"))
    assert loaded.vocab.dtype == torch.long and torch.equal(loaded.vocab, head.vocab)
    assert all(0 <= a <= 1 for a in history[-1]["acc"])
    ids = torch.tensor(rows[0]["prompt_ids"] + rows[0]["response_ids"])
    anchors = torch.tensor([len(rows[0]["prompt_ids"])])
    _, slots = sequence_loss(BlockForward(head), target, ids, anchors, cfg)
    known = torch.isin(ids[anchors + torch.arange(1, 5)], head.vocab).sum()
    assert slots == int(known) < 4  # "ce" supervises in-vocabulary slots only (random data: some are not)
    with pytest.raises(ValueError, match="exceeds the target's vocabulary"):
        build_head(dataclasses.replace(cfg, draft_vocab=V + 1), target, rows)


def test_warm_start_continues_from_a_trained_head(target, data, tmp_path):
    parent, _ = train(smoke(data, tmp_path / "parent", draft_vocab=40, loss="ce"), target, progress=False)
    cfg = smoke(data, tmp_path / "child", draft_vocab=40, loss="ce", init=str(tmp_path / "parent"), seed=1)
    start = build_head(cfg, target, [])
    saved = DraftHead.from_pretrained(str(tmp_path / "parent"))  # bf16 on disk: the start is its rounding
    for (name, a), b in zip(saved.state_dict().items(), start.state_dict().values()):
        assert torch.equal(a, b), name
    assert torch.equal(start.vocab, parent.vocab)
    train(cfg, target, progress=False)
    prov = json.loads((tmp_path / "child" / "provenance.json").read_text())
    parent_prov = json.loads((tmp_path / "parent" / "provenance.json").read_text())
    assert prov["lineage"] == [parent_prov["command"]] and "--init" in prov["command"]
    md = (tmp_path / "child" / "PROVENANCE.md").read_text()
    assert md.index(parent_prov["command"]) < md.index(prov["command"])
    args = build_parser().parse_args(shlex.split(prov["command"])[3:])
    assert train_config(args) == dataclasses.replace(cfg, data=args.data, out=args.out)
    with pytest.raises(ValueError, match="differs in"):
        build_head(dataclasses.replace(cfg, draft_vocab=0), target, [])
    with pytest.raises(ValueError, match="head directory"):
        smoke(data, tmp_path / "x", init=str(tmp_path / "nowhere"))
