"""A sweep's cells run as one parent run and its children, concurrently on Ray, with early stopping."""
