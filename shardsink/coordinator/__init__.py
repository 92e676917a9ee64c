"""The coordinator: mint and append operators, the accounting check that
guards every append, supervision, and the consensus process it runs."""
