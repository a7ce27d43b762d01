"""docembed as a LlamaIndex `BaseEmbedding` (`pip install 'docembed[llamaindex]'`).

from docembed.integrations.llamaindex import DocembedEmbedding
index = VectorStoreIndex(nodes, embed_model=DocembedEmbedding("sbert"))
"""

from __future__ import annotations

from typing import Any

from docembed.integrations import as_model, missing_extra

try:
    from llama_index.core.base.embeddings.base import BaseEmbedding
    from pydantic import PrivateAttr
except ImportError as error:  # pragma: no cover - the extra is installed in the test environment
    raise missing_extra("llama-index-core", "llamaindex") from error


class DocembedEmbedding(BaseEmbedding):
    """A docembed model behind LlamaIndex's embedding interface: unit-length vectors, the model's query /
    document prompts, multi-vector models mean-pooled (see docembed.integrations)."""

    _model: Any = PrivateAttr()

    def __init__(self, model="sbert", device: str = "auto", batch_size: int = 32, **options: Any):
        loaded = as_model(model, device)
        super().__init__(model_name=f"docembed/{loaded.name}", embed_batch_size=batch_size, **options)
        self._model = loaded

    @classmethod
    def class_name(cls) -> str:
        return "DocembedEmbedding"

    def _vectors(self, texts: list[str], query: bool) -> list[list[float]]:
        encode = self._model.encode_query if query else self._model.encode_document
        return encode(texts, self.embed_batch_size, normalize_embeddings=True, pooling="mean").tolist()

    def _get_query_embedding(self, query: str) -> list[float]:
        return self._vectors([query], query=True)[0]

    def _get_text_embedding(self, text: str) -> list[float]:
        return self._vectors([text], query=False)[0]

    def _get_text_embeddings(self, texts: list[str]) -> list[list[float]]:
        return self._vectors(texts, query=False)

    async def _aget_query_embedding(self, query: str) -> list[float]:
        return self._get_query_embedding(query)

    async def _aget_text_embedding(self, text: str) -> list[float]:
        return self._get_text_embedding(text)
