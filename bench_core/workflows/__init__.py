"""One module (or small package) per workflow: A/B, validation, side by side with a revision, distributed,
diagnose, and the worker process that replays a test elsewhere."""
