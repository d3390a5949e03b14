"""The job's ``compression:`` section: how each client's update is encoded before it is sent, and
how the server's broadcast is (docs/communication.md; the encoders are ``raysim.compress``).

Usage:
    compression:
      upload: {kind: topk, fraction: 0.01}          # error_feedback: true by default
    compression:
      upload: {kind: qsgd, bits: 4}                 # unbiased: no error feedback by default
    compression:
      download: {kind: topk, fraction: 0.1}         # the broadcast, as a difference (downlink)

Every kind keeps an error-feedback residual in the client's state when ``error_feedback`` is true
(the part of the update not sent this round is added to the next one); PowerSGD also keeps its
warm-started Q there. Only plugins whose update holds a parameter delta can be compressed: the
plugin class's ``UPDATE_DELTA`` says where it is (``raysim.config.plugins.update_delta``); the same
plugins broadcast a plain model, which ``download`` encodes (the server keeps its residual).
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, Field, SerializerFunctionWrapHandler, model_serializer, model_validator

from raysim.config.plugins import PluginSection, update_delta
from raysim.config.privacy import PrivacyConfig
from raysim.registry import get


class TopK(BaseModel, frozen=True, extra="forbid"):
    """The ``ceil(fraction * d)`` largest-magnitude coordinates of each tensor, with their indices;
    the tensor whole where they would weigh as much as it does (a large fraction)."""

    kind: Literal["topk"]
    fraction: float = Field(gt=0, le=1)
    error_feedback: bool = True


class RandomK(BaseModel, frozen=True, extra="forbid"):
    """``ceil(fraction * d)`` coordinates of each tensor drawn at random from the shared seed of
    (run seed, round, client): the server draws the same, so no index is sent. Without error
    feedback they are scaled by ``d / k`` (Wangni et al. 2018), so the update stays unbiased."""

    kind: Literal["randomk"]
    fraction: float = Field(gt=0, le=1)
    error_feedback: bool = True


class QSGD(BaseModel, frozen=True, extra="forbid"):
    """QSGD (Alistarh et al. 2017): each coordinate stochastically rounded to one of ``2^bits - 1``
    levels of its bucket's norm; unbiased. A bucket is ``bucket`` consecutive values of a tensor
    (512 as in the paper's experiments; 0 or null: the whole tensor, far noisier for a large one)."""

    kind: Literal["qsgd"]
    bits: int = Field(ge=1, le=16)
    bucket: int | None = Field(512, ge=0)
    error_feedback: bool = False


class ScaledSign(BaseModel, frozen=True, extra="forbid"):
    """signSGD with error feedback (Karimireddy et al. 2019): ``||p||_1 / d * sign(p)``."""

    kind: Literal["sign"]
    error_feedback: bool = True


class PowerSGD(BaseModel, frozen=True, extra="forbid"):
    """PowerSGD (Vogels et al. 2019): each matrix as a rank-``rank`` product ``P Q^T`` from one
    power iteration on the warm-started Q; vectors (biases, norms), and matrices whose factors
    would weigh as much as they do (``(n + m) rank >= n m``), sent whole."""

    kind: Literal["powersgd"]
    rank: int = Field(ge=1)
    error_feedback: bool = True


EncoderConfig = Annotated[TopK | RandomK | QSGD | ScaledSign | PowerSGD, Field(discriminator="kind")]


class CompressionConfig(BaseModel, frozen=True, extra="forbid"):
    """How the models travel: ``upload`` encodes each client's parameter delta, ``download`` the
    server's broadcast (as the change from the model the clients hold; raysim.compress.downlink)."""

    upload: EncoderConfig | None = None
    download: EncoderConfig | None = None

    @model_validator(mode="after")
    def _says_what(self) -> CompressionConfig:
        if self.upload is None and self.download is None:
            raise ValueError("set upload, download or both (e.g. upload: {kind: topk, fraction: 0.01})")
        return self

    @model_serializer(mode="wrap")
    def _set_directions(self, handler: SerializerFunctionWrapHandler) -> dict[str, Any]:
        """An unset direction stays out of the resolved config: an upload-only job reads as before."""
        return {key: value for key, value in handler(self).items() if value is not None}


def compression_problems(
    compression: CompressionConfig | None, algorithm: PluginSection | None, privacy: PrivacyConfig | None
) -> list[str]:
    """What compression cannot honour, before anything is built: a plugin whose update holds no
    parameter delta (one line, for upload, download or both); with ``upload``, local DP, whose
    noise makes the update that leaves the client dense again. Central DP is fine: its clip acts
    on the decoded update, so the bound holds for every encoder (QSGD's decoded norm may exceed its
    input's: a clip before encoding would not bound it)."""
    if compression is None:
        return []
    problems = []
    if (
        algorithm is not None
        and update_delta(get("algorithm", algorithm.name).factory, algorithm.config) is None
    ):
        name = algorithm.name
        problems.append(
            f"compression: algorithm {name!r} sends no parameter delta that an encoder could compress "
            f"(its update is another kind of value, or it runs its own protocol); unset compression"
            if compression.upload is not None
            else f"compression.download: algorithm {name!r} is not one whose clients train from the "
            f"broadcast model and send back a plain delta (its update is another kind of value, or it "
            f"runs its own protocol); unset compression.download"
        )
    if compression.download is not None and not compression.download.error_feedback:
        problems.append(
            "compression.download.error_feedback: false leaves the clients' decoded model and the "
            "server's (evaluated, saved) apart for good, their gap a sum of every round's encoding "
            "error; set error_feedback: true"
        )
    if compression.upload is not None and privacy is not None and privacy.local is not None:
        problems.append(
            "compression: privacy.local noises every coordinate of the update that leaves the client, "
            "so nothing would be left to compress; unset one of them"
        )
    return problems
