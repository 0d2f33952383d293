"""The embedded default model: a tiny LLaVA trained here on the synthetic camera world."""
