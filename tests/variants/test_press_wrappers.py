"""kvpress's wrapper presses as our press's hyperparameters, each against a transcription of kvpress's code: PyramidKV's
layer budgets (pyramidkv_press.py), ChunkKV's chunks (chunkkv_press.py), CriticalKV's and CriticalAdaKV's two stages
(criticalkv_press.py), on random scores and values with grouped-query heads (h = 6, g = 2) and an awkward n.

b - batch, h - query heads, g - key/value heads, n - prompt positions, e - value dim, m - model width
"""

from __future__ import annotations

import pytest
import torch
from attnbench.interface import PromptContext, UnsupportedOptionError
from attnbench.registry import registry
from attnbench.variants.kv_compression import compress
from attnbench.variants.press_wrappers import chunk_scores, critical_scores, kvpress_marks, output_norms, pyramid_budget

H, G, N, E, M = 6, 2, 301, 16, 24


def kvpress_layer_budget(q_len: int, compression_ratio: float, window_size: int, layers: int, layer: int,
                         beta: int = 20) -> int:  # fmt: skip
    """PyramidKVPress.get_layer_budget, transcribed."""
    max_capacity_prompt = window_size + q_len * (1 - compression_ratio)
    min_num = (max_capacity_prompt - window_size) / beta
    max_num = (max_capacity_prompt - window_size) * 2 - min_num
    if max_num >= q_len - window_size:
        max_num = q_len - window_size
        min_num = (max_capacity_prompt - window_size) * 2 - max_num
    if not (q_len >= max_num >= min_num >= window_size):
        return round(q_len * (1 - compression_ratio))
    steps = (max_num - min_num) / (layers - 1)
    return round(max_num - layer * steps)


PYRAMIDS = [(301, 40, 32, 30), (2048, 256, 32, 30), (2048, 1900, 32, 30), (1000, 10, 0, 24), (4096, 512, 64, 32),
            (300, 200, 8, 7)]  # (n, budget, window, layers)


@pytest.mark.parametrize("n, budget, window, layers", PYRAMIDS)
def test_pyramid_budgets_are_kvpress_s_and_average_the_budget(n: int, budget: int, window: int, layers: int) -> None:
    ours = [pyramid_budget(budget, n, layer, layers, window + 1) for layer in range(layers)]
    theirs = [kvpress_layer_budget(n, 1 - budget / n, window, layers, layer) for layer in range(layers)]
    assert ours == [max(1, kept) for kept in theirs]  # a layer keeps one position at least (kvpress's may keep none)
    assert abs(sum(ours) / layers - budget) <= 0.5  # the line's average is the budget, up to its rounding
    assert ours == sorted(ours, reverse=True)


def test_pyramid_falls_back_to_the_uniform_budget_as_kvpress_does() -> None:
    assert pyramid_budget(20, 2048, 0, 30, 33) == 20  # the last layer would keep 1 < the window
    assert pyramid_budget(100, 2048, 3, 1, 1) == 100  # one layer


def test_the_pyramid_is_what_a_press_keeps_per_layer() -> None:
    q, k, v = (torch.randn(1, heads, 400, E) for heads in (H, G, G))
    snapkv = registry.create("snapkv", budget=100, layers="pyramid")
    for layer in (0, 15, 29):
        state = snapkv.for_prompt(PromptContext(layer, 30)).prefill_state(q, k, v)
        assert state.length == pyramid_budget(100, 400, layer, 30, 33)


# ---- ChunkKV ------------------------------------------------------------------------------------------------------


def kvpress_chunks(scores: torch.Tensor, chunk_length: int, n_chunks_kept: int) -> list[int]:
    """ChunkKVPress.compress's kept positions (batch row 0), transcribed, for a given number of chunks kept (kvpress
    derives it from the compression ratio)."""
    kv_len = scores.shape[-1]
    num_complete_chunks, remaining_tokens = kv_len // chunk_length, kv_len % chunk_length
    main_scores = scores[..., : num_complete_chunks * chunk_length]
    main_chunk_scores = main_scores.sum(dim=1).view(-1, num_complete_chunks, chunk_length).mean(dim=-1)
    if remaining_tokens > 0:
        remaining_chunk_score = scores[..., -remaining_tokens:].sum(dim=1).mean(dim=-1, keepdim=True)
        chunk_scores_ = torch.cat([main_chunk_scores, remaining_chunk_score], dim=-1)
    else:
        chunk_scores_ = main_chunk_scores
    top_chunks = chunk_scores_.topk(n_chunks_kept, dim=-1)
    indices = []
    for chunk_idx in top_chunks.indices[0]:
        if chunk_idx < num_complete_chunks:
            indices.append(torch.arange(chunk_idx * chunk_length, (chunk_idx + 1) * chunk_length))
        else:
            indices.append(torch.arange(num_complete_chunks * chunk_length, kv_len))
    return torch.cat(indices).sort()[0].tolist()


@pytest.mark.parametrize("n, chunk", [(301, 20), (300, 20), (301, 7)])
def test_chunks_keep_kvpress_s_chunks(n: int, chunk: int) -> None:
    """With the budget kvpress's chunks add up to, every head keeps exactly kvpress's positions; with a budget between
    whole chunks, kvpress's and the first positions of the next best chunk."""
    scores = torch.rand(1, G, n, generator=torch.Generator().manual_seed(n + chunk))
    k = torch.randn(1, G, n, E)
    ours = chunk_scores(scores, chunk)
    for kept_chunks in (1, 4, n // chunk - 1):
        theirs = kvpress_chunks(scores, chunk, kept_chunks)
        _, _, positions = compress(k, k, ours, len(theirs))
        assert all(row == theirs for row in positions[0].tolist())
        _, _, more = compress(k, k, ours, len(theirs) + 3)
        extra = sorted(set(more[0, 0].tolist()) - set(theirs))
        assert len(extra) == 3 and extra == list(range(extra[0], extra[0] + 3))  # the next chunk's first three
        assert extra[0] % chunk == 0


def test_tied_chunks_go_by_place_and_a_short_prompt_keeps_the_press_s_scores() -> None:
    flat = torch.ones(1, G, 301)
    _, _, positions = compress(torch.randn(1, G, 301, E), torch.randn(1, G, 301, E), chunk_scores(flat, 20), 50)
    assert positions[0, 0].tolist() == list(range(50))
    short = torch.rand(1, G, 15)
    assert torch.equal(chunk_scores(short, 20), short)  # kvpress delegates to the press below one chunk


def test_the_window_s_inf_is_read_as_kvpress_s_max_plus_one() -> None:
    scores = torch.rand(1, G, 100)
    scores[..., -8:] = float("inf")
    marked = kvpress_marks(scores)
    assert torch.equal(marked[..., -8:], torch.full((1, G, 8), scores[..., :-8].max().item() + 1))
    theirs = scores.clone()
    theirs[..., -8:] = scores[..., :-8].max() + 1
    assert torch.equal(chunk_scores(scores, 20), chunk_scores(theirs, 20))


# ---- CriticalKV ---------------------------------------------------------------------------------------------------


def kvpress_vwl1norm(values: torch.Tensor, weight: torch.Tensor, heads: int) -> torch.Tensor:
    """CriticalKVPress.vwl1norm, transcribed (module.o_proj.weight = weight, head_dim = e)."""
    bsz, num_key_value_heads, k_len, head_dim = values.shape
    groups = heads // num_key_value_heads
    wo = weight.transpose(0, 1).view(heads, head_dim, weight.shape[0])
    v = values.repeat_interleave(groups, dim=1)
    norms = torch.stack([torch.norm(v[:, head] @ wo[head].unsqueeze(0), p=1, dim=-1) for head in range(heads)], dim=1)
    return norms.view(bsz, num_key_value_heads, groups, k_len).mean(dim=2)


def kvpress_critical(scores: torch.Tensor, values: torch.Tensor, weight: torch.Tensor, n_kept: int) -> torch.Tensor:
    """CriticalKVPress.score, transcribed (first_stage_ratio 0.5, epsilon 1e-4; n_kept = k_len (1 - ratio))."""
    top_k_index = torch.topk(scores, int(n_kept * 0.5), sorted=True, dim=-1).indices
    scores = (scores + 1e-4) * kvpress_vwl1norm(values, weight, H)
    scores.scatter_(-1, top_k_index, torch.finfo(scores.dtype).max)
    return scores


def kvpress_critical_adakv_kept(scores: torch.Tensor, values: torch.Tensor, weight: torch.Tensor, n_kept: int,
                                alpha_safeguard: float = 0.2) -> list[set[int]]:  # fmt: skip
    """CriticalAdaKVPress.compress, transcribed: the positions each head keeps (the complement of its masked ones)."""
    scores = scores.clone()
    bsz, num_key_value_heads, k_len = scores.shape
    n_safe = int(n_kept * alpha_safeguard)
    top_indices = torch.topk(scores, n_safe, dim=-1).indices
    scores.scatter_(-1, top_indices, torch.finfo(scores.dtype).max)
    budget_scores = scores.scatter(-1, top_indices, torch.finfo(scores.dtype).max).reshape(bsz, -1)
    top_indices = torch.topk(budget_scores, n_kept * num_key_value_heads, dim=-1).indices
    head_budgets = torch.zeros(num_key_value_heads, dtype=torch.int64)
    head_budgets.scatter_add_(0, (top_indices // k_len).flatten(), torch.ones_like(top_indices.flatten()))
    first = (head_budgets * 0.5).to(torch.int64).tolist()
    top_k_index = torch.topk(scores, max(first), sorted=True, dim=-1).indices
    for head in range(num_key_value_heads):
        scores[:, head, :].scatter_(-1, top_k_index[:, head, : first[head]], torch.finfo(scores.dtype).max)
    scores = (scores + 1e-4) * kvpress_vwl1norm(values, weight, H)
    top_k_index = torch.topk(scores, int(max(head_budgets)), sorted=True, dim=-1).indices
    for head in range(num_key_value_heads):
        scores[:, head, :].scatter_(-1, top_k_index[:, head, : head_budgets[head]], torch.finfo(scores.dtype).max)
    n_pruned = num_key_value_heads * (k_len - n_kept)
    pruned = torch.topk(-scores.reshape(bsz, -1), n_pruned, dim=1).indices.flatten().tolist()
    kept = [set(range(k_len)) for _ in range(num_key_value_heads)]
    for index in pruned:
        kept[index // k_len].discard(index % k_len)
    return kept


def random_layer(seed: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """scores (1, g, n), values (1, g, n, e), an output projection (m, h e)."""
    generator = torch.Generator().manual_seed(seed)
    return (torch.rand(1, G, N, generator=generator), torch.randn(1, G, N, E, generator=generator),
            torch.randn(M, H * E, generator=generator) / 8)  # fmt: skip


def test_output_norms_are_kvpress_s_vwl1norm() -> None:
    _, values, weight = random_layer(0)
    torch.testing.assert_close(output_norms(values, weight), kvpress_vwl1norm(values, weight, H), rtol=1e-5, atol=1e-5)
    per_query_head = output_norms(values.repeat_interleave(H // G, dim=1), weight)  # select_per="query-head"
    assert per_query_head.shape == (1, H, N)


@pytest.mark.parametrize("budget", [40, 151])
def test_critical_is_kvpress_s_criticalkv(budget: int) -> None:
    scores, values, weight = random_layer(budget)
    ours = critical_scores(scores, values, budget, PromptContext(out_proj=weight), "snapkv")
    theirs = kvpress_critical(scores.clone(), values, weight, budget)
    torch.testing.assert_close(ours, theirs, rtol=1e-5, atol=1e-6)
    assert torch.equal(ours.topk(budget).indices.sort().values, theirs.topk(budget).indices.sort().values)


@pytest.mark.parametrize("budget", [40, 151])
def test_critical_adaptive_keeps_kvpress_s_critical_adakv(budget: int) -> None:
    from attnbench.variants.headwise import adaptive_lengths

    scores, values, weight = random_layer(budget + 1)
    ours = critical_scores(scores, values, budget, PromptContext(out_proj=weight), "snapkv", adaptive=True)
    lengths = adaptive_lengths(ours, budget, 0.2)  # the allocation heads="adaptive" runs on them
    kept = ours.argsort(dim=-1, descending=True)
    assert [set(kept[0, head, : lengths[0, head]].tolist()) for head in range(G)] == kvpress_critical_adakv_kept(
        scores, values, weight, budget)


def test_critical_without_the_model_says_what_it_needs() -> None:
    scores, values, _ = random_layer(1)
    with pytest.raises(UnsupportedOptionError, match="snapkv with critical=True .* output projection"):
        critical_scores(scores, values, 40, None, "snapkv")
    with pytest.raises(UnsupportedOptionError, match="output projection"):
        critical_scores(scores, values, 40, PromptContext(), "snapkv")
