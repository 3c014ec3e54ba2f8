"""Taking samples: where work runs (backends, devices), the one sample loop, a scenario's series (`measure`),
the rounds protocol both sides of a comparison share, counted work and GPU telemetry. Imports only the core."""
