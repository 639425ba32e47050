"""Error feedback kept in the params (collectives/feedback.py): what a contribution left out
stays in the node's params, so nothing it trained is lost to the codec, and the next delta
sends it."""

from __future__ import annotations

import torch

from collectives.feedback import ErrorFeedback
from collectives.group import GroupInfo
from collectives.sparse import SparseTopK
from collectives.work import Work

NUMEL = 3 * 4096 + 100
CHUNKS = GroupInfo(step=0, members=("a", "b"), nonce="").wire_chunks(NUMEL)
CODEC = SparseTopK(64)  # what get_codec("sparse") builds


def test_unsent_is_exactly_what_the_wire_bytes_leave_out() -> None:
    g = torch.Generator().manual_seed(1)
    payload = torch.randn(NUMEL, generator=g)
    unsent = ErrorFeedback(CODEC, decay=0.95).unsent(payload, CHUNKS)
    for a, b in CHUNKS:
        sent = CODEC.decode(CODEC.encode(payload[a:b]), b - a)
        assert torch.equal(payload[a:b] - sent, unsent[a:b])
        assert int((sent != 0).sum()) == CODEC.selected(b - a)  # k per 4096 (fewer in a tail)


def _step(fb: ErrorFeedback, theta: torch.Tensor, params: torch.Tensor
          ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """One outer step of a lone member as attempt.py runs it: (θ_new, params_new, sent)."""
    delta = theta - params
    unsent = fb.unsent(delta, CHUNKS)
    sent = delta - unsent
    new = theta - sent  # the mean of one contribution, lr 1
    work = Work(snapshot=params.clone(), rounds=1, weight=None)
    work.rebase(onto=new, base=work.snapshot)
    fb.keep(work, unsent)
    assert work.shift is not None
    return new, params + work.shift, sent


def test_with_decay_one_the_params_keep_all_their_work_and_theta_catches_up() -> None:
    fb = ErrorFeedback(CODEC, decay=1.0)
    g = torch.Generator().manual_seed(2)
    theta = torch.zeros(NUMEL)
    params = theta.clone()
    trained = torch.zeros(NUMEL, dtype=torch.float64)
    gaps = []
    direction = torch.randn(NUMEL, generator=g)  # training steps point much the same way
    for _ in range(30):
        work = (direction + 0.5 * torch.randn(NUMEL, generator=g)) * 1e-2
        params += work
        trained += work.double()
        theta, params, _ = _step(fb, theta, params)
        gaps.append(float((theta - params).norm()))
    # nothing trained was dropped: the params are the sum of the work (fp32 rounding only)
    assert torch.allclose(params.double(), trained, atol=1e-4)
    # θ follows the params: their gap is what is still unsent, the top of it goes out at
    # every step (1.6 % of the values), so θ points the way the work does
    cos = float(torch.nn.functional.cosine_similarity(theta.double(), trained, dim=0))
    assert cos > 0.8 and gaps[-1] < 0.6 * float(trained.norm()), (cos, gaps[-1])


def test_decay_keeps_that_share_and_zero_drops_what_was_not_sent() -> None:
    g = torch.Generator().manual_seed(3)
    theta = torch.zeros(NUMEL)
    params = torch.randn(NUMEL, generator=g)
    for decay in (0.0, 0.95):
        new, after, sent = _step(ErrorFeedback(CODEC, decay=decay), theta, params.clone())
        unsent = (theta - params) - sent
        assert torch.allclose(after, new - decay * unsent, atol=1e-6)
    # decay 0: the params are θ_new, SparseLoCo without error feedback
    new, after, _ = _step(ErrorFeedback(CODEC, decay=0.0), theta, params.clone())
    assert torch.equal(after, new)
