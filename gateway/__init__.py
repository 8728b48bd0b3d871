"""WhatsApp Cloud API webhook gateway: durable ingest, exactly-once processing, at-most-once sends."""

__version__ = "0.1.0"
