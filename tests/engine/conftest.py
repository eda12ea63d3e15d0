"""Fixtures every engine test may use without importing them: a conftest's fixture is one per session,
while a session fixture imported into several modules is set up once per module that imports it."""

from __future__ import annotations

from tests.engine.model_fixtures import hf_default_model

__all__ = ["hf_default_model"]
