"""raysim: a Ray-based federated-learning simulator."""
