"""Reference tests: the kit's head against z-lab's reference implementation, the ``dflash`` PyPI package
(0.1.0; ``make setup`` installs it ``--no-deps``, as its declared pins clash with this kit's).

- Forward equality, causal and bidirectional, in both checkpoint directions: their ``save_pretrained``
  -> ``DraftHead.from_pretrained``, and ``DraftHead.save_pretrained`` -> their ``from_pretrained``.
- Multi-round draft chains: ``dflash_generate`` vs ``generate`` with the kit's ``dflash`` method (the
  head's argmax chain) on a tiny random Qwen3 target, and with the kit-trained head shipped for the
  embedded SmolLM2 target.

The package's ``_cuda_time`` calls ``torch.cuda.synchronize``; it is replaced by ``time.perf_counter``
here. Drafts are recorded by the output head the package is handed (``_output_head``), which for the
shipped head is the draft vocabulary's rows of the target's ``lm_head`` (every other token -inf): the
reference has no notion of a reduced draft vocabulary, this kit's extension.
"""
import importlib.util
import time

import pytest
import torch
from torch import nn
from transformers import Qwen3Config, Qwen3ForCausalLM

from fakes import ByteTokenizer
from jetflow.engine.decode import generate
from jetflow.drafting.head import DraftHead, HeadConfig, block_mask
from jetflow.drafting.methods import make_proposer
from jetflow.util.paths import shipped_head_dir
from jetflow.engine.target import Target
from test_checkpoint import QWEN3_8B, QWEN3_30B_A3B

if importlib.util.find_spec("dflash") is None:  # skip only when absent; a broken install fails below
    pytest.skip("the reference package is not installed: pip install --no-deps dflash==0.1.0 (make setup does)",
                allow_module_level=True)
import dflash.model as ref  # noqa: E402

V, H, TARGET_LAYERS, BLOCK = 24, 64, 6, 8
SIZES = dict(hidden_size=H, intermediate_size=96, num_attention_heads=4, num_key_value_heads=2, head_dim=16,
             tie_word_embeddings=False, max_position_embeddings=512)


@pytest.fixture(autouse=True)
def cpu_timer(monkeypatch):
    monkeypatch.setattr(ref, "_cuda_time", time.perf_counter)


def perturb_norms(module: nn.Module) -> None:
    """Norms start at ones; randomise them so a norm applied in the wrong place would show."""
    with torch.no_grad():
        for name, p in module.named_parameters():
            if "norm" in name:
                p.uniform_(0.5, 1.5)


def reference_head(causal: bool | None, seed: int = 0) -> nn.Module:
    """A random ``DFlashDraftModel``; ``causal=None`` leaves ``is_causal`` unset (= bidirectional)."""
    torch.manual_seed(seed)
    cfg = Qwen3Config(**SIZES, vocab_size=V, num_hidden_layers=2, initializer_range=0.2, block_size=BLOCK,
                      num_target_layers=TARGET_LAYERS,
                      dflash_config={"target_layer_ids": [1, 3], "mask_token_id": V - 1})
    if causal is not None:
        cfg.is_causal = causal
    model = ref.DFlashDraftModel(cfg).eval()
    perturb_norms(model)
    return model


def kit_head(causal: bool, seed: int = 0) -> DraftHead:
    torch.manual_seed(seed)
    head = DraftHead(HeadConfig(hidden_size=H, intermediate_size=96, num_layers=2, num_heads=4, num_kv_heads=2,
                                head_dim=16, rms_norm_eps=1e-6, rope_theta=10000.0, vocab_size=V,
                                block_size=BLOCK, target_layer_ids=(1, 3), num_target_layers=TARGET_LAYERS,
                                mask_token_id=V - 1, causal=causal))
    perturb_norms(head)
    return head.eval()


def reference_block(model, taps: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
    """Their forward: context taps (T, L, H) + block embeddings (1, Q, H) -> (1, Q, H)."""
    T, Q = taps.shape[0], x.shape[1]
    with torch.no_grad():
        return model(position_ids=torch.arange(T + Q)[None], noise_embedding=x, target_hidden=taps.flatten(-2)[None])


def kit_block(head: DraftHead, taps: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
    """Ours, with the mask the head's own config asks for."""
    T, Q = taps.shape[0], x.shape[1]
    state = head.extend(None, taps)
    with torch.no_grad():
        return head(x, torch.arange(T, T + Q)[None], state.kv, block_mask(T, Q, head.config.causal)[None])


def max_diff(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a - b).abs().max())


# ----------------------------------------------------------------------------- forward, both directions
@pytest.mark.parametrize("causal,expected", [(True, True), (False, False), (None, False)])
def test_their_checkpoint_loads_into_the_kit_and_matches(tmp_path, causal, expected):
    theirs = reference_head(causal)
    theirs.save_pretrained(tmp_path)
    ours = DraftHead.from_pretrained(str(tmp_path))
    assert ours.config.causal is expected
    assert (ours.config.block_size, ours.config.mask_token_id, ours.config.target_layer_ids) == (BLOCK, V - 1, (1, 3))
    taps, x = torch.randn(7, 2, H), torch.randn(1, BLOCK, H)
    assert max_diff(kit_block(ours, taps, x), reference_block(theirs, taps, x)) < 1e-5


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("causal", [True, False])
def test_kit_checkpoint_loads_into_the_reference_and_matches(tmp_path, causal, dtype):
    kit_head(causal).save_pretrained(tmp_path, dtype=dtype)
    ours = DraftHead.from_pretrained(str(tmp_path))  # both read the same (possibly bf16-rounded) weights
    theirs = ref.DFlashDraftModel.from_pretrained(str(tmp_path), dtype=torch.float32).eval()
    assert all(layer.self_attn.is_causal is causal for layer in theirs.layers)
    assert (theirs.block_size, theirs.mask_token_id, list(theirs.target_layer_ids)) == (BLOCK, V - 1, [1, 3])
    taps, x = torch.randn(9, 2, H), torch.randn(1, BLOCK, H)
    assert max_diff(kit_block(ours, taps, x), reference_block(theirs, taps, x)) < 1e-5


def test_causal_flag_matters_here():
    """The forward tests can fail: the same weights under the other mask differ by far more than 1e-5."""
    theirs = reference_head(True)
    taps, x = torch.randn(7, 2, H), torch.randn(1, BLOCK, H)
    ours = kit_head(False)
    ours.load_state_dict(theirs.state_dict(), strict=False)
    assert max_diff(kit_block(ours, taps, x), reference_block(theirs, taps, x)) > 1e-2


@pytest.mark.parametrize("published", [QWEN3_8B, QWEN3_30B_A3B])
def test_reference_tensor_names_and_shapes_match_published_heads(published):
    with torch.device("meta"):
        theirs = ref.DFlashDraftModel(Qwen3Config(**published))
        ours = DraftHead(HeadConfig.from_hf_dict(published))
    shapes = lambda m: {k: tuple(v.shape) for k, v in m.state_dict().items()}  # noqa: E731
    assert shapes(theirs) == shapes(ours)


# ----------------------------------------------------------------------------- draft chains
class RecordingOutputHead(nn.Module):
    """The output head handed to the reference: logits over the whole vocabulary from the lm_head rows
    of ``vocab`` (-inf elsewhere; all rows when None); records each round's argmax drafts."""

    def __init__(self, lm_head_weight: torch.Tensor, vocab: torch.Tensor | None = None):
        super().__init__()
        self.full, self.vocab = lm_head_weight.shape[0], vocab
        self.weight = lm_head_weight if vocab is None else lm_head_weight[vocab]
        self.drafts: list[list[int]] = []

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:  # (1, Q, H) -> (1, Q, V)
        scores = hidden @ self.weight.T
        if self.vocab is not None:
            logits = scores.new_full((*scores.shape[:-1], self.full), float("-inf"))
            scores = logits.index_copy_(-1, self.vocab, scores)
        self.drafts.append(scores[0].argmax(-1).tolist())
        return scores


def compare_chains(monkeypatch, model, target: Target, head_dir, ids, max_new: int, vocab=None) -> dict:
    """Run both loops on ``ids``; return their outputs, per-round commits and drafts."""
    recorder = RecordingOutputHead(target.model.get_output_embeddings().weight, vocab)
    monkeypatch.setattr(ref, "_output_head", lambda _target: recorder)
    eos = sorted(target.eos_ids) or None
    theirs = ref.dflash_generate(model, target.model, ids[None], max_new, eos, return_stats=True)
    proposer = make_proposer("dflash", target, head=str(head_dir), draft_dtype=torch.float32)
    ours = generate(target, ids, proposer, budget=model.block_size - 1, max_new_tokens=max_new)
    kit_drafts = [r.tree.tokens[1:].tolist() for r in ours.rounds]
    full = [i for i, d in enumerate(recorder.drafts) if len(d) == model.block_size - 1]
    return {"tokens": (theirs.output_ids[0, ids.numel():].tolist(), ours.tokens),
            "commits": (theirs.acceptance_lengths, [len(r.committed) for r in ours.rounds]),
            "drafts": (recorder.drafts, kit_drafts), "full": full,
            "equal_full": sum(recorder.drafts[i] == kit_drafts[i] for i in full)}


def tiny_qwen3_target() -> Target:
    torch.manual_seed(1)
    model = Qwen3ForCausalLM(Qwen3Config(**SIZES, vocab_size=V, num_hidden_layers=TARGET_LAYERS,
                                         initializer_range=0.3)).eval().requires_grad_(False)
    model.generation_config.eos_token_id = None
    return Target(model, ByteTokenizer(), "tiny-qwen3")


@pytest.mark.parametrize("causal", [True, False])
def test_draft_chains_equal_dflash_generate_on_a_tiny_qwen3(tmp_path, monkeypatch, causal):
    model = reference_head(causal)
    model.save_pretrained(tmp_path)
    ids = torch.randint(0, V - 1, (12,), generator=torch.Generator().manual_seed(3))
    out = compare_chains(monkeypatch, model, tiny_qwen3_target(), tmp_path, ids, max_new=120)
    theirs, ours = out["drafts"]
    assert out["tokens"][0] == out["tokens"][1] and len(out["tokens"][1]) == 120
    assert out["commits"][0] == out["commits"][1] and max(out["commits"][0]) > 1  # some drafts accepted
    assert len(theirs) == len(ours) and len(out["full"]) >= len(theirs) - BLOCK
    assert out["equal_full"] == len(out["full"])  # every full-block round drafts the same chain
    if causal:  # a causal head's shortened last blocks draft a prefix of the full chain
        assert all(o[:len(t)] == t for t, o in zip(theirs, ours))


def test_shipped_head_saved_and_loaded_by_the_reference_drafts_what_the_kit_drafts(smol, tmp_path, monkeypatch):
    """The kit-trained JetFlow head of the embedded SmolLM2 target, written by the kit and read by
    the reference package: the same draft chain in every round, the same commits, the same output."""
    head = DraftHead.from_pretrained(str(shipped_head_dir("jetflow")))
    head.save_pretrained(tmp_path, dtype=torch.float32)
    model = ref.DFlashDraftModel.from_pretrained(str(tmp_path), dtype=torch.float32).eval()
    assert all(layer.self_attn.is_causal for layer in model.layers)
    prompts = ["Write a Python function that reverses a list, and show an example call.",
               "Natalia sold clips to 48 of her friends in April, and then she sold half as many clips in May. "
               "How many clips did Natalia sell altogether in April and May?"]
    for prompt in prompts:
        out = compare_chains(monkeypatch, model, smol, tmp_path, smol.encode(prompt), max_new=64, vocab=head.vocab)
        theirs, ours = out["drafts"]
        assert out["tokens"][0] == out["tokens"][1]
        assert out["commits"][0] == out["commits"][1]
        assert len(theirs) == len(ours) and out["full"] and out["equal_full"] == len(out["full"])
        assert all(o[:len(t)] == t for t, o in zip(theirs, ours))
