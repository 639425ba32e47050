"""The local dashboard server (node/dashboard.py): static page + the status record, read-only."""

from __future__ import annotations

import http.client
import json

import pytest

from node.dashboard import HISTORY_ROUNDS, Dashboard
from node.status import StatusBoard
from protocol.records import RoundRecord


@pytest.fixture
def dashboard():
    d = Dashboard(0)
    yield d
    d.close()


def _get(d, path, *, method="GET", host=None):
    conn = http.client.HTTPConnection("127.0.0.1", d.port, timeout=5)
    try:
        conn.request(method, path, headers={"Host": host or f"127.0.0.1:{d.port}"})
        r = conn.getresponse()
        return r.status, dict(r.getheaders()), r.read()
    finally:
        conn.close()


def test_serves_the_page_and_the_same_status_record(tmp_path, dashboard):
    board = StatusBoard(tmp_path / "status.json", log_rounds=False)
    rounds = [{"round": i, "mean_reward": i / 10, "accuracy": 0.5, "train": {"loss": 1.0},
               "rollouts_published": 8} for i in range(HISTORY_ROUNDS + 7)]
    for r in rounds:
        board.on_round(RoundRecord.from_dict(r))
    body = board.flush()
    dashboard.publish(body, rounds, [{"step": 0, "peers": 2, "param_hash": "ab", "seconds": 1.5,
                                      "bytes_sent": 10, "excluded": {"x": 1},
                                      "blames_total": {"no_show": 2}}])
    status, headers, raw = _get(dashboard, "/api/status")
    assert status == 200 and headers["Content-Type"] == "application/json"
    data = json.loads(raw)
    assert data["status"] == json.loads((tmp_path / "status.json").read_text())  # one truth
    assert len(data["rounds"]) == HISTORY_ROUNDS and data["rounds"][-1]["round"] == HISTORY_ROUNDS + 6
    assert "train" not in data["rounds"][0]                       # only what the page draws
    assert data["outer_steps"][0]["param_hash"] == "ab" and "excluded" not in data["outer_steps"][0]
    assert data["outer_steps"][0]["blames_total"] == {"no_show": 2}  # peers held off, shown
    status, headers, page = _get(dashboard, "/")
    assert status == 200 and b'id="reward-chart"' in page and b"http" not in page.split(b"<body")[0]
    assert "default-src 'self'" in headers["Content-Security-Policy"]
    for asset in ("/dashboard.js", "/dashboard.css"):
        assert _get(dashboard, asset)[0] == 200
    js = _get(dashboard, "/dashboard.js")[2]
    assert b"innerHTML" not in js                                 # peer strings stay text


def test_read_only_localhost_only(dashboard):
    assert _get(dashboard, "/nope")[0] == 404
    assert _get(dashboard, "/api/status", method="POST")[0] == 501
    assert _get(dashboard, "/api/status", host="evil.example:80")[0] == 421  # DNS rebinding
    assert _get(dashboard, "/", host=f"localhost:{dashboard.port}")[0] == 200
    assert dashboard._server.server_address[0] == "127.0.0.1"
    with pytest.raises(ValueError, match="127.0.0.1"):
        Dashboard(0, host="0.0.0.0")


def test_the_page_gets_the_heldout_scores_to_draw(tmp_path, dashboard):
    board = StatusBoard(tmp_path / "status.json", log_rounds=False)
    score = {"after_rounds": 10, "greedy_accuracy": 0.5, "sampled_accuracy": 0.25, "questions": 32}
    rounds = [{"round": i, "mean_reward": 0.1, **({"heldout": score} if i == 9 else {})}
              for i in range(12)]
    for r in rounds:
        board.on_round(RoundRecord.from_dict(r))
    dashboard.publish(board.flush(), rounds, [])
    data = json.loads(_get(dashboard, "/api/status")[2])
    assert data["status"]["heldout"]["greedy_accuracy"] == 0.5       # the card
    assert [r["heldout"] for r in data["rounds"] if r["heldout"]] == [score]  # the curve
    assert b'id="heldout-chart"' in _get(dashboard, "/")[2]


def test_the_page_gets_the_feed_sources_to_show(tmp_path, dashboard):
    board = StatusBoard(tmp_path / "status.json", log_rounds=False)
    feeds = {"proven": 1, "live": 0, "trial": 3, "idle": 3, "dropped_idle": 12,
             "dropped_no_signal": 1, "idle_slot_rounds": 40, "searched": 2, "network_full": 1}
    rounds = [{"round": 0, "mean_reward": 0.1, "feeds": feeds}]
    board.on_round(RoundRecord.from_dict(rounds[0]))
    dashboard.publish(board.flush(), rounds, [])
    assert json.loads(_get(dashboard, "/api/status")[2])["status"]["feeds"] == feeds
    page, js = _get(dashboard, "/")[2], _get(dashboard, "/dashboard.js")[2]
    assert b'id="feeds"' in page and b'id="feeds-detail"' in page
    assert b"s.feeds" in js and b"slot-rounds held by idle sources" in js
    assert b"tried in searches" in js and b"refused for a full network" in js


def test_the_page_gets_each_peer_s_link_to_show(tmp_path, dashboard):
    """Issue 33: direct or relayed, per peer in the peer table and counted in the card."""
    board = StatusBoard(tmp_path / "status.json", log_rounds=False)
    board.on_peers([{"peer_id": "p1", "model": "m"}, {"peer_id": "p2", "model": "m"}],
                   links={"p1": "relayed", "p3": "direct"})
    dashboard.publish(board.flush(), [], [])
    status = json.loads(_get(dashboard, "/api/status")[2])["status"]
    assert status["links"] == {"direct": 1, "relayed": 1, "peers": {"p1": "relayed",
                                                                   "p3": "direct"}}
    assert {p["peer_id"]: p["link"] for p in status["peers_seen"]} == {"p1": "relayed",
                                                                      "p2": None}
    page, js = _get(dashboard, "/")[2], _get(dashboard, "/dashboard.js")[2]
    assert b'id="links"' in page and b"<th>link</th>" in page
    assert b"s.links" in js and b'q.link || "not connected"' in js
