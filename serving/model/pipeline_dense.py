"""Pipeline parallelism for dense decoder architectures that mlx-lm pipelines only for
others (llama: Llama 3.x, SmolLM2, Mistral; qwen3: dense Qwen3), in its own PipelineMixin
pattern: the same forward as its qwen2 model's. Every rank embeds the tokens; the last
rank runs the first layers and sends its hidden state up the pipeline; rank 0 runs the
last layers; an all_gather gives every rank rank 0's output, so every rank computes the
same logits (and samples the same tokens, as in tensor mode). The two architectures
differ only inside their layers (qwen3's q/k norms, llama's optional sliding window) and
in the head (qwen3 ties it to the embeddings more often), none of which the split sees."""

from __future__ import annotations

from typing import Any

import mlx.core as mx
from mlx_lm.models import llama, qwen3
from mlx_lm.models.base import create_attention_mask
from mlx_lm.models.pipeline import PipelineMixin


class DenseStage(PipelineMixin):
    """The pipelined forward, mixed into a model's inner module (which owns
    `embed_tokens`, `layers` and `norm`) ahead of that module's own __call__."""

    # The inner module's, declared for the type checker only.
    embed_tokens: Any
    norm: Any
    sliding_window: int | None

    def _init_stage(self) -> None:
        # nn.Module's __init__ does not chain to the mixin's: its defaults, set here.
        self.pipeline_rank, self.pipeline_size = 0, 1
        self.start_idx, self.end_idx = 0, None
        self._between_layers: mx.Dtype | None = None

    def _hidden_dtype(self, embedded: mx.array) -> mx.Dtype:
        """The hidden state's dtype between layers, which the previous stage sends. In
        mixed-precision checkpoints (float32 norms beside float16 weights, as GGUF
        conversions have) it is wider than the embedding's, and receiving it as the
        embedding's dtype (what mlx-lm's pipelined models do) reads garbage. Found once,
        from a lazy pass through one local layer that is never evaluated."""
        if self._between_layers is None:
            probe = self.pipeline_layers[0](embedded[:, :1], None, cache=None)
            self._between_layers = probe.dtype
        return self._between_layers

    def _masks(self, h: mx.array, layers: list[Any], cache: list[Any]) -> tuple[Any, Any]:
        """The full-attention and sliding-window masks (llama may mix both kinds of
        layer; qwen3 has only full attention), each made from a cache of its kind."""
        full = next((i for i, layer in enumerate(layers) if not _sliding(layer)), None)
        sliding = next((i for i, layer in enumerate(layers) if _sliding(layer)), None)
        full_mask = create_attention_mask(h, cache[full]) if full is not None else None
        sliding_mask = (
            create_attention_mask(h, cache[sliding], window_size=self.sliding_window)
            if sliding is not None
            else None
        )
        return full_mask, sliding_mask

    def __call__(
        self, inputs: mx.array, cache: Any = None, input_embeddings: mx.array | None = None
    ) -> mx.array:
        h = input_embeddings if input_embeddings is not None else self.embed_tokens(inputs)
        layers = self.pipeline_layers
        cache = cache if cache is not None else [None] * len(layers)
        full_mask, sliding_mask = self._masks(h, layers, cache)
        if self.pipeline_rank < self.pipeline_size - 1:
            h = mx.distributed.recv(h.shape, self._hidden_dtype(h), self.pipeline_rank + 1)
        for layer, layer_cache in zip(layers, cache, strict=True):
            h = layer(h, sliding_mask if _sliding(layer) else full_mask, cache=layer_cache)
        if self.pipeline_rank != 0:
            h = mx.distributed.send(h, (self.pipeline_rank - 1) % self.pipeline_size)
            if cache[-1] is not None:  # keep the send in the graph that is evaluated
                if hasattr(cache[-1], "depend_on"):  # the quantized cache's own arrays
                    cache[-1].depend_on(h)
                else:
                    cache[-1].keys = mx.depends(cache[-1].keys, h)
        if self.pipeline_size > 1:
            h = mx.distributed.all_gather(h)[: h.shape[0]]
        return self.norm(h)


def _sliding(layer: Any) -> bool:
    return bool(getattr(layer, "use_sliding", False))


class PipelineLlamaModel(DenseStage, llama.LlamaModel):
    def __init__(self, args: llama.ModelArgs) -> None:
        llama.LlamaModel.__init__(self, args)
        self._init_stage()


class PipelineQwen3Model(DenseStage, qwen3.Qwen3Model):
    sliding_window = None  # qwen3's layers all attend fully

    def __init__(self, args: qwen3.ModelArgs) -> None:
        qwen3.Qwen3Model.__init__(self, args)
        self._init_stage()


class LlamaModel(llama.Model):
    def __init__(self, args: llama.ModelArgs) -> None:
        super().__init__(args)
        self.model = PipelineLlamaModel(args)

    @property
    def layers(self) -> list[Any]:
        return self.model.pipeline_layers  # this rank's layers: its caches are made for them


class Qwen3Model(qwen3.Model):
    def __init__(self, args: qwen3.ModelArgs) -> None:
        super().__init__(args)
        self.model = PipelineQwen3Model(args)

    @property
    def layers(self) -> list[Any]:
        return self.model.pipeline_layers


# mlx-lm's module for the architecture -> the model class that pipelines it.
ADAPTERS: dict[str, type[Any]] = {
    "mlx_lm.models.llama": LlamaModel,
    "mlx_lm.models.qwen3": Qwen3Model,
}
