"""The GPT network and the language-model task: loss at initialisation, causality, generation,
checkpoints that decode on their own, freezing and fine-tuning, and a real fit to a short text."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
import torch
from lightning.pytorch import Trainer, seed_everything
from lightning.pytorch.loggers import TensorBoardLogger
from projkit.testing import config
from torch.nn import functional as F

from conftest import CORPUS
from proj import main
from proj.data import TextDataModule
from proj.models import LanguageModel
from proj.nets import GPT

VERSE = "Shall I compare thee to a summer's day?\nThou art more lovely and more temperate:\n"
VOCAB = "".join(sorted(set(VERSE)))
FROZEN = ["net.transformer.wte.*", "net.transformer.h.0.*"]


def tiny_gpt(**kwargs) -> GPT:
    sizes = {"vocab_size": len(VOCAB), "block_size": 16, "n_layer": 2, "n_head": 2, "n_embd": 32, **kwargs}
    return GPT(**sizes)


def tiny_model(**kwargs) -> LanguageModel:
    return LanguageModel(tiny_gpt(), VOCAB, **kwargs)


def write_verse(folder: Path, repeats: int = 40) -> Path:
    path = folder / "verse.txt"
    path.write_text(VERSE * repeats, encoding="utf-8")
    return path


def test_initial_loss_is_log_vocab_size():
    data = TextDataModule(str(CORPUS), url=None, block_size=64, batch_size=32)
    data.setup("fit")
    x, y = next(iter(data.val_dataloader()))
    torch.manual_seed(0)
    net = GPT(data.vocab_size, block_size=64, n_layer=4, n_head=4, n_embd=128)
    loss = F.cross_entropy(net(x).flatten(0, 1), y.flatten())
    assert loss.item() == pytest.approx(math.log(data.vocab_size), abs=0.1)


def test_gpt_shares_embedding_and_output_weights_and_scales_residual_projections():
    net = tiny_gpt(n_layer=8, n_embd=256, n_head=4)
    assert net.lm_head.weight is net.transformer.wte.weight
    projection = net.transformer.h[0].attn.c_proj.weight
    assert projection.std().item() == pytest.approx(0.02 / math.sqrt(16), rel=0.1)
    assert net.transformer.h[0].mlp.c_fc.weight.std().item() == pytest.approx(0.02, rel=0.1)


def test_attention_is_causal():
    torch.manual_seed(0)
    net = tiny_gpt().eval()
    idx = torch.randint(0, len(VOCAB), (1, 16))
    for t in (0, 5, 15):
        changed = idx.clone()
        changed[0, t] = (changed[0, t] + 1) % len(VOCAB)
        before, after = net(idx), net(changed)
        assert torch.equal(before[:, :t], after[:, :t]), t
        assert not torch.allclose(before[:, t], after[:, t])


def test_heads_must_divide_the_width():
    with pytest.raises(
        ValueError, match=r"net\.n_embd \(100\) must be divisible by net\.n_head \(3\).*n_embd=99"
    ):
        tiny_gpt(n_embd=100, n_head=3)


def test_sequence_longer_than_block_size_is_refused():
    with pytest.raises(ValueError, match=r"length 17: this GPT's block_size is 16"):
        tiny_gpt()(torch.zeros(1, 17, dtype=torch.long))


def test_activation_checkpointing_gives_the_same_gradients():
    idx = torch.randint(0, len(VOCAB), (4, 16), generator=torch.Generator().manual_seed(0))
    grads = []
    for recompute in (False, True):
        torch.manual_seed(0)
        net = tiny_gpt(activation_checkpointing=recompute, dropout=0.0)
        F.cross_entropy(net(idx[:, :-1]).flatten(0, 1), idx[:, 1:].flatten()).backward()
        grads.append({name: p.grad for name, p in net.named_parameters()})
    assert grads[0].keys() == grads[1].keys()
    for name in grads[0]:
        assert torch.allclose(grads[0][name], grads[1][name], atol=1e-6), name


@pytest.mark.slow
def test_seeded_generation_repeats_and_restores_training_mode():
    torch.manual_seed(0)
    model = tiny_model().train()

    def sample(seed: int) -> str:
        torch.manual_seed(seed)
        return model.generate("Sh", 40)  # longer than block_size: the context is cropped

    first = sample(1)
    assert first == sample(1) and first != sample(2)
    assert first.startswith("Sh") and len(first) == 42 and set(first) <= set(VOCAB)
    assert model.training
    greedy = model.generate("Sh", 10, temperature=0.0)
    assert greedy == model.generate("Sh", 10, temperature=0.0)
    torch.manual_seed(3)
    top_1 = model.generate("Sh", 10, top_k=1)
    assert top_1 == greedy


def test_prompt_outside_the_vocabulary_is_refused():
    model = tiny_model()
    with pytest.raises(
        ValueError, match=r"(?s)prompt: characters 'Z', '#' are not in the model's vocabulary.*training text"
    ):
        model.generate("Za#", 5)
    with pytest.raises(ValueError, match=r"(?s)model\.sample_prompt: characters 'Z'.*training text"):
        tiny_model(sample_prompt="Z")
    with pytest.raises(ValueError, match="prompt is empty"):
        model.generate("", 5)


def test_unknown_freeze_pattern_lists_parameter_names():
    with pytest.raises(
        ValueError, match=r"model\.freeze: pattern 'net\.blocks\.\*'.*net\.transformer\.wte\.weight"
    ):
        tiny_model(freeze=["net.blocks.*"])


def test_frozen_parameters_stay_identical_and_out_of_the_optimizer(tmp_path):
    seed_everything(0)
    model = tiny_model(freeze=FROZEN, num_samples=0)
    frozen = {n: p.detach().clone() for n, p in model.named_parameters() if not p.requires_grad}
    assert set(frozen) == {
        n
        for n, _ in model.named_parameters()
        if n.startswith(("net.transformer.wte.", "net.transformer.h.0."))
    }
    trainable = {n: p.detach().clone() for n, p in model.named_parameters() if p.requires_grad}
    data = TextDataModule(str(write_verse(tmp_path)), url=None, block_size=16, batch_size=8)
    trainer = Trainer(
        max_steps=5,
        limit_val_batches=0,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        default_root_dir=tmp_path,
    )
    trainer.fit(model, data)
    optimized = {id(p) for group in trainer.optimizers[0].param_groups for p in group["params"]}
    for name, p in model.named_parameters():
        if name in frozen:
            assert torch.equal(p, frozen[name]) and id(p) not in optimized, name
        else:
            assert not torch.equal(p, trainable[name]) and id(p) in optimized, name


def save_checkpoint(path: Path, model: LanguageModel, vocab: str) -> None:
    torch.save({"state_dict": model.state_dict(), "hyper_parameters": {"vocab": vocab}}, path)


def test_init_from_loads_the_weights_of_a_checkpoint_with_the_same_vocabulary(tmp_path):
    torch.manual_seed(0)
    source = tiny_model()
    save_checkpoint(tmp_path / "source.ckpt", source, VOCAB)
    torch.manual_seed(1)
    model = tiny_model(init_from=str(tmp_path / "source.ckpt"))
    for name, p in model.state_dict().items():
        assert torch.equal(p, source.state_dict()[name]), name
    assert "init_from" not in model.hparams


def test_init_from_a_checkpoint_with_another_vocabulary_is_refused(tmp_path):
    save_checkpoint(tmp_path / "other.ckpt", tiny_model(), VOCAB.replace("S", "X"))
    with pytest.raises(
        ValueError,
        match=r"(?s)model\.init_from: the vocabulary of .*other\.ckpt' differs from the data's.*"
        r"only in the checkpoint: 'X', only in the data: 'S'.*same characters.*from scratch",
    ):
        tiny_model(init_from=str(tmp_path / "other.ckpt"))
    with pytest.raises(ValueError, match=r"model\.init_from: no checkpoint file at 'nope\.ckpt'"):
        tiny_model(init_from="nope.ckpt")


@pytest.mark.slow
def test_validation_samples_go_to_tensorboard(tmp_path):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    seed_everything(0)
    model = tiny_model(sample_tokens=20, num_samples=2)
    data = TextDataModule(str(write_verse(tmp_path)), url=None, block_size=16, batch_size=8)
    logger = TensorBoardLogger(tmp_path, name="tb")
    trainer = Trainer(
        max_steps=2,
        val_check_interval=2,
        limit_val_batches=1,
        logger=logger,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
    )
    trainer.fit(model, data)
    events = EventAccumulator(logger.log_dir)
    events.Reload()
    assert {"samples/0/text_summary", "samples/1/text_summary"} <= set(events.Tags()["tensors"])
    assert not (Path(logger.log_dir) / "samples.txt").exists()


def test_test_loss_is_the_mean_over_every_token_with_a_short_last_batch(tmp_path):
    torch.manual_seed(0)
    model = tiny_model()
    data = TextDataModule(str(write_verse(tmp_path)), url=None, block_size=16, batch_size=6)
    trainer = Trainer(logger=False, enable_progress_bar=False, enable_model_summary=False)
    (result,) = trainer.test(model, data, verbose=False)
    x, y = (torch.cat(parts) for parts in zip(*data.test_dataloader(), strict=True))
    assert len(x) % 6  # the last batch is short
    with torch.no_grad():
        expected = F.cross_entropy(model(x).flatten(0, 1), y.flatten())
    assert result["test/loss"] == pytest.approx(expected.item(), rel=1e-5)
    assert result["test/ppl"] == pytest.approx(expected.exp().item(), rel=1e-5)


def test_an_overridden_loss_is_the_one_every_stage_uses(tmp_path):
    class HalfLoss(LanguageModel):
        def loss(self, logits, targets, reduction="mean"):
            return 0.5 * super().loss(logits, targets, reduction)

    torch.manual_seed(0)
    model = HalfLoss(tiny_gpt(), VOCAB)
    data = TextDataModule(str(write_verse(tmp_path)), url=None, block_size=16, batch_size=6)
    trainer = Trainer(logger=False, enable_progress_bar=False, enable_model_summary=False)
    (result,) = trainer.test(model, data, verbose=False)
    x, y = (torch.cat(parts) for parts in zip(*data.test_dataloader(), strict=True))
    with torch.no_grad():
        logits = model(x)
    assert model.loss(logits, y, reduction="none").shape == (y.numel(),)
    assert result["test/loss"] == pytest.approx(
        0.5 * F.cross_entropy(logits.flatten(0, 1), y.flatten()).item()
    )
    assert model.training_step((x[:2], y[:2]), 0).item() == pytest.approx(
        model.loss(logits[:2], y[:2]).item()
    )


@pytest.mark.slow
def test_debug_run_of_the_text_experiment(workdir):
    cli = main(
        [
            "fit",
            "--config",
            config("shakespeare_char_cpu.yaml"),
            "--config",
            config("debug/fast_dev_run.yaml"),
            f"--data.init_args.path={write_verse(workdir)}",
        ]
    )
    assert cli.trainer.state.finished
    assert torch.isfinite(cli.trainer.callback_metrics["test/loss"])


# One real fit of a small GPT to a short verse, shared by the tests below.
FIT_ARGS = (
    "--model.init_args.net.init_args.n_layer=2",
    "--model.init_args.net.init_args.n_head=2",
    "--model.init_args.net.init_args.n_embd=64",
    "--model.init_args.net.init_args.block_size=64",
    "--model.init_args.optimizer.init_args.lr=0.003",
    "--model.init_args.scheduler.init_args.warmup_steps=20",
    "--model.init_args.scheduler.init_args.total_steps=300",
    "--model.init_args.sample_prompt=Thou",
    "--model.init_args.sample_tokens=50",
    "--data.init_args.batch_size=16",
    "--data.init_args.val_windows=null",
    "--trainer.max_steps=300",
    "--trainer.val_check_interval=100",
    "--trainer.enable_progress_bar=false",
)


@pytest.fixture(scope="module")
def verse_run(tmp_path_factory: pytest.TempPathFactory):
    """``fit`` with the CPU experiment's config shrunk to a 2-layer GPT, on 40 copies of a verse."""
    folder = tmp_path_factory.mktemp("verse_run")
    with pytest.MonkeyPatch.context() as patch:
        patch.chdir(folder)
        args = [
            "--config",
            config("shakespeare_char_cpu.yaml"),
            f"--data.init_args.path={write_verse(folder)}",
        ]
        cli = main(["fit", *args, *FIT_ARGS])
    return cli, folder, args, str(folder / cli.trainer.checkpoint_callback.best_model_path)


@pytest.mark.slow
def test_small_gpt_overfits_a_short_text(verse_run):
    cli, *_ = verse_run
    assert cli.trainer.checkpoint_callback.best_model_score < 0.1
    assert cli.trainer.callback_metrics["test/loss"] < 0.1
    assert cli.trainer.callback_metrics["test/ppl"] < 1.1


@pytest.mark.slow
def test_run_logs_throughput_memory_perplexity_and_samples(verse_run):
    _, folder, _, _ = verse_run
    run = folder / "runs" / "shakespeare_char_cpu" / "version_0"
    header = (run / "metrics.csv").read_text().splitlines()[0].split(",")
    expected = {"train/loss", "train/grad_norm", "train/tokens_per_sec", "train/peak_memory_mb"}
    assert expected | {"val/loss", "val/ppl", "test/loss", "test/ppl", "lr/decay"} <= set(header)
    samples = (run / "samples.txt").read_text()
    assert [line for line in samples.splitlines() if line.startswith("---")] == [
        f"--- step {step}, sample 0 ---" for step in (100, 200, 300)
    ]
    assert "Thou art more lovely" in samples.split("--- step 300")[1]


@pytest.mark.slow
def test_checkpoint_loads_weights_only_and_decodes_on_its_own(verse_run):
    *_, best = verse_run
    checkpoint = torch.load(best, weights_only=True)
    assert checkpoint["hyper_parameters"]["vocab"] == VOCAB
    model = LanguageModel.load_from_checkpoint(best, weights_only=True)
    assert model.generate("Thou", 40, temperature=0.0) == (VERSE * 2)[VERSE.index("Thou") :][:44]


@pytest.mark.slow
def test_predict_from_checkpoint_continues_the_prompts(verse_run, monkeypatch):
    _, folder, args, best = verse_run
    monkeypatch.chdir(folder)
    # The network's sizes come from the checkpoint, not the command line; sampling settings do not.
    predicted = main(
        [
            "predict",
            *args,
            f"--ckpt_path={best}",
            '--data.init_args.predict_prompts=["Shall I", "Thou art"]',
            "--model.init_args.predict_tokens=20",
            "--model.init_args.temperature=0",
        ]
    )
    expected = [(VERSE * 2)[VERSE.index(p) :][: len(p) + 20] for p in ("Shall I", "Thou art")]
    assert predicted.trainer.predict_loop.predictions == [expected]


@pytest.mark.slow
def test_fine_tuning_from_weights_keeps_frozen_layers(verse_run, monkeypatch):
    _, folder, args, best = verse_run
    monkeypatch.chdir(folder)
    tuned = main(
        [
            "fit",
            *args,
            *FIT_ARGS,
            f"--model.init_args.init_from={best}",
            f"--model.init_args.freeze={FROZEN}",
            "--trainer.max_steps=10",
            "--test_after_fit=false",
        ]
    )
    before = torch.load(best, weights_only=True)["state_dict"]
    checkpoint = torch.load(Path(tuned.trainer.checkpoint_callback.dirpath) / "last.ckpt", weights_only=True)
    after = checkpoint["state_dict"]
    frozen = [n for n in after if n.startswith(("net.transformer.wte.", "net.transformer.h.0."))]
    assert frozen and all(torch.equal(before[n], after[n]) for n in frozen)
    changed = "net.transformer.h.1.mlp.c_fc.weight"
    assert not torch.equal(before[changed], after[changed])
    n_optimized = sum(len(g["params"]) for g in checkpoint["optimizer_states"][0]["param_groups"])
    assert n_optimized == len(list(tuned.model.parameters())) - len(frozen)


@pytest.mark.slow
def test_checkpoint_on_text_with_other_characters_is_refused(verse_run, monkeypatch):
    _, folder, args, best = verse_run
    monkeypatch.chdir(folder)
    # As many characters as the verse, but not the same ones: the embedding rows would be misread.
    other = folder / "other.txt"
    other.write_text((VERSE * 40).replace("S", "X"), encoding="utf-8")
    message = r"(?s)vocabulary differs from the data's.*only in the checkpoint: 'S'.*only in the data: 'X'"
    with pytest.raises(ValueError, match=message + r".*data\.init_args\.path"):
        main(["test", *args, f"--data.init_args.path={other}", f"--ckpt_path={best}"])
