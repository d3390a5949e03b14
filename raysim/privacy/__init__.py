"""Differential privacy: accounting, calibration and the noise that crosses rounds (docs/privacy.md).

The mechanisms act where the data does: each client's contribution to the server's sums is
clipped on its worker and the sums are noised once on the driver (``raysim.private_sums``, the
contract's law), a client's update is noised before it leaves the device (local DP), or each
example's gradient is clipped inside local training (DP-SGD, ``raysim.train``). This room says what
those releases cost in privacy: the accountants (dp-accounting's RDP and PLD, prv-accountant's
PRV), the noise calibrated from a target epsilon, adaptive clipping's bound, and DP-FTRL's
correlated noise.
"""
