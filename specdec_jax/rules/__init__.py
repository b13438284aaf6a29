"""Acceptance rules beyond the paper's, each an `acceptance.AcceptanceRule`
passed as `rule=` (`typical.py`: Medusa's typical acceptance, lossy).
docs/extending.md writes one."""
