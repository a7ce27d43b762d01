"""Adapters that plug a docembed model into other frameworks, each an optional extra:

- `docembed.integrations.mteb.MtebEncoder`: MTEB's encoder protocol (`pip install 'docembed[mteb]'`);
- `docembed.integrations.langchain.DocembedEmbeddings`: LangChain's `Embeddings` (`docembed[langchain]`);
- `docembed.integrations.llamaindex.DocembedEmbedding`: LlamaIndex's `BaseEmbedding` (`docembed[llamaindex]`).

These frameworks take one vector per text. A multi-vector model (nugget, sbert-tokens) is mean-pooled there
(its vectors averaged, then normalised), which is not how docembed scores it (mean-MaxSim); MTEB's adapter
can keep the vectors and score mean-MaxSim itself (`MtebEncoder(..., multi_vector="maxsim")`).
"""

from __future__ import annotations


def as_model(model_or_name, device: str = "auto"):
    """A docembed Model from a Model or anything `docembed.load` takes."""
    from docembed.api import Model, load

    return model_or_name if isinstance(model_or_name, Model) else load(model_or_name, device=device)


def missing_extra(package: str, extra: str) -> ImportError:
    return ImportError(f"this adapter needs {package}: pip install 'docembed[{extra}]'")
