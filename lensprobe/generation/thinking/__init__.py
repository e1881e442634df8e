"""Latent thinking: what goes in at a thinking position, and the rules that decide when a row thinks."""
