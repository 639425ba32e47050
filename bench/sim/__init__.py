"""A discrete-event simulation of the swarm's rollout gossip (issue 15, item 3).

Layers, each module one concept: ``config`` (the inputs) <- ``wan`` (latencies), ``cpu``
(where work waits), ``pool`` (SAPO's sampling), ``announce`` (the O(N) announcements, closed
form) <- ``schemes`` (flood, feeds) <- ``engine`` (the event loop) <- ``metrics`` (what a run
measured) <- ``calibrate`` (costs from real gossip_bench rows, and the error) <- ``__main__``
(the grid, JSON and PNG). ``realbench`` runs gossip_bench's rows for calibration.

    PYTHONPATH=$PWD python -m bench.sim calibrate --real bench/sim/data/*.json
    PYTHONPATH=$PWD python -m bench.sim grid
"""
