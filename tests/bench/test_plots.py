"""The benchmark's plots say what a reader needs to read them: the loss plot names why the packed mode's curve lies
apart from the others (it trains on other batches: whole packs, one step each)."""

from flatcollate.bench import plots


def loss_plot(monkeypatch, tmp_path, modes: dict[str, list[float]]):
    """The figure `plot_losses` draws for `modes` (mode -> losses), caught where it would be saved."""
    drawn = []
    monkeypatch.setattr(plots.Figure, "savefig", lambda figure, path, **kwargs: drawn.append(figure))
    result = {"modes": {m: {"losses": losses} for m, losses in modes.items()}, "loss_equivalence": None}
    plots.plot_losses(result, tmp_path / "losses.png")
    (figure,) = drawn
    (ax,) = figure.axes
    return ax


def test_the_loss_legend_says_the_packed_mode_trains_other_batches(monkeypatch, tmp_path):
    modes = {"padded": [3.0, 2.5, 2.0], "hf_flattened": [3.0, 2.5, 2.0], "flattened": [3.0, 2.5, 2.0], "packed": [2.9]}
    ax = loss_plot(monkeypatch, tmp_path, modes)
    labels = [text.get_text() for text in ax.get_legend().get_texts()]
    assert labels[:3] == ["padded", "hf_flattened", "flattened"]
    assert labels[3] == "packed: other batches (whole packs, one step each), so another curve"


def test_without_the_packed_mode_the_legend_names_the_modes_alone(monkeypatch, tmp_path):
    ax = loss_plot(monkeypatch, tmp_path, {"padded": [1.0], "flattened": [1.0]})
    assert [text.get_text() for text in ax.get_legend().get_texts()] == ["padded", "flattened"]
