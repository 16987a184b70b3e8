"""Integrations of kvindex into serving engines (each imports its engine lazily)."""
