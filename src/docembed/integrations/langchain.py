"""docembed as a LangChain `Embeddings` (`pip install 'docembed[langchain]'`).

from docembed.integrations.langchain import DocembedEmbeddings
from langchain_core.vectorstores import InMemoryVectorStore
store = InMemoryVectorStore.from_texts(texts, DocembedEmbeddings("sbert"))
"""

from __future__ import annotations

from docembed.integrations import as_model, missing_extra

try:
    from langchain_core.embeddings import Embeddings
except ImportError as error:  # pragma: no cover - the extra is installed in the test environment
    raise missing_extra("langchain-core", "langchain") from error


class DocembedEmbeddings(Embeddings):
    """`embed_documents` / `embed_query` with a docembed model: unit-length vectors (cosine = dot product,
    what LangChain's stores assume), the model's document / query prompts, multi-vector models mean-pooled."""

    def __init__(self, model="sbert", device: str = "auto", batch_size: int = 32):
        self.model = as_model(model, device)
        self.batch_size = batch_size

    def _vectors(self, texts: list[str], query: bool) -> list[list[float]]:
        encode = self.model.encode_query if query else self.model.encode_document
        vectors = encode(texts, self.batch_size, normalize_embeddings=True, pooling="mean")
        return vectors.tolist()

    def embed_documents(self, texts: list[str]) -> list[list[float]]:
        return self._vectors(list(texts), query=False)

    def embed_query(self, text: str) -> list[float]:
        return self._vectors([text], query=True)[0]
