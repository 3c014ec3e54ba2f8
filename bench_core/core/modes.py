"""What a run does, as one value (`session.SessionConfig.mode`, which refuses the combinations that cannot run).
Serve and replica are processes bench_core starts itself: a side's server, a fresh process of the gate."""

PLAIN, SAVE, GATE, SIDE_BY_SIDE, SERVE, REPLICA = "plain", "save", "stored gate", "side by side", "serve", "replica"
OWN = (SERVE, REPLICA)
GATED = (SAVE, GATE, SIDE_BY_SIDE)    # stores or decides against another run: never from a part of the suite
