"""mmpretrain 1.2.0's multimodal models against transformers 5.

mmpretrain imports its multimodal models (BLIP, BLIP-2, OFA, RAM, ...)
whenever ``transformers >= 4.28`` is installed (``WITH_MULTIMODAL`` in
``mmpretrain.utils.dependency``). transformers 5 removed names they import
(``apply_chunking_to_forward``, ``find_pruneable_heads_and_indices``,
``prune_linear_layer`` from ``transformers.modeling_utils``); BLIP's bare
``except:`` then leaves ``PreTrainedModel = None`` and the class statement
after it raises ``TypeError: NoneType takes no arguments``. Every
``import mmpretrain.models`` fails, and with it ``mmdet.models`` (through
``reid_data_preprocessor``) and ``mmseg.models``: no detector or segmentor
can be built.

The fix (``'mmpretrain_multimodal'`` in :data:`pola_mm.compat.FIXES`) runs
where mmpretrain and transformers >= 5 are installed
(:func:`mmpretrain_would_fail`, from metadata, nothing imported), right
after ``mmpretrain.utils.dependency`` loads (through
:func:`pola_mm_startup.after_import`, or at once where it has loaded). Only
where mmpretrain would import its multimodal models and the installed
transformers lacks a name they import (:func:`missing_names`, checked on
the installed package), it sets ``WITH_MULTIMODAL = False``: mmpretrain
then registers the multimodal models as placeholders, as it does without
transformers, and building one raises an ``ImportError`` that names the
missing names and the fix (``transformers<5``). Nothing else of mmpretrain
changes; the fix cannot help once ``mmpretrain.models`` has been imported.
"""
import importlib
import importlib.util
from typing import Dict, List, Tuple

__all__ = ['MULTIMODAL_IMPORTS', 'missing_names', 'mmpretrain_would_fail',
           'transformers_major', 'install', 'patch_dependency_module',
           'state']

#: What mmpretrain 1.2.0 imports from transformers where
#: ``WITH_MULTIMODAL`` holds, by module (its multimodal models, their
#: tokenizers and its Hugging Face model registry).
MULTIMODAL_IMPORTS: Dict[str, Tuple[str, ...]] = {
    'transformers': (
        'PreTrainedModel', 'AutoConfig', 'AutoTokenizer', 'BartTokenizer',
        'BasicTokenizer', 'BertTokenizer', 'BertTokenizerFast',
        'LlamaTokenizer', 'WordpieceTokenizer', 'AutoModelForCausalLM'),
    'transformers.models.auto.auto_factory': ('_BaseAutoModelClass', ),
    'transformers.activations': ('ACT2FN', ),
    'transformers.modeling_outputs': (
        'BaseModelOutputWithPastAndCrossAttentions',
        'BaseModelOutputWithPoolingAndCrossAttentions',
        'CausalLMOutputWithCrossAttentions', 'BaseModelOutputWithPast',
        'CausalLMOutputWithPast', 'ModelOutput', 'Seq2SeqLMOutput'),
    'transformers.modeling_utils': (
        'PreTrainedModel', 'apply_chunking_to_forward',
        'find_pruneable_heads_and_indices', 'prune_linear_layer',
        'GenerationConfig', 'GenerationMixin', 'PretrainedConfig'),
    'transformers.models.bert.configuration_bert': ('BertConfig', ),
    'transformers.models.opt.configuration_opt': ('OPTConfig', ),
    'transformers.utils': (
        'add_code_sample_docstrings', 'add_start_docstrings',
        'add_start_docstrings_to_model_forward', 'logging',
        'replace_return_docstrings'),
}

#: ``'patched'`` where the fix set ``WITH_MULTIMODAL = False``, with the
#: missing names; empty until ``mmpretrain.utils.dependency`` loads.
state: Dict[str, List[str]] = {}


def missing_names() -> List[str]:
    """``module.name`` for every name of :data:`MULTIMODAL_IMPORTS` that the
    installed transformers does not provide (a module that fails to import
    counts as all of its names). Imports transformers' modules, as
    mmpretrain's multimodal models would."""
    missing = []
    for module_name, names in MULTIMODAL_IMPORTS.items():
        try:
            module = importlib.import_module(module_name)
        except Exception:  # mmpretrain's bare except swallows these too
            module = None
        missing += [f'{module_name}.{n}' for n in names
                    if module is None or not hasattr(module, n)]
    return missing


def transformers_major() -> int:
    """The installed transformers' major version from its metadata (no
    import); 0 where it is not installed."""
    from importlib.metadata import PackageNotFoundError, version
    try:
        return int(version('transformers').split('.')[0])
    except (PackageNotFoundError, ValueError):
        return 0


def mmpretrain_would_fail() -> bool:
    """The gate at ``import pola_mm``, without importing either package:
    mmpretrain is installed and its multimodal models are not imported
    yet, and the installed transformers is a 5.x or newer (the release
    that removed the names). Where it holds, the names themselves are
    checked when mmpretrain's dependency module loads
    (:func:`patch_dependency_module`)."""
    import sys
    if 'mmpretrain.models.multimodal' in sys.modules:
        return False
    for name in ('mmpretrain', 'transformers'):
        try:
            if importlib.util.find_spec(name) is None:
                return False
        except (ImportError, ValueError):
            return False
    return transformers_major() >= 5


def _placeholder_register(missing: List[str], version: str):
    """mmpretrain's ``register_multimodal_placeholder`` with a message that
    says why the model is unavailable and how to get it."""

    def register(names, registry) -> None:
        for name in names:

            def unavailable(*args, _name=name, **kwargs):
                raise ImportError(
                    f'{_name} is unavailable: mmpretrain 1.2.0\'s multimodal '
                    f'models import names that transformers {version} no '
                    f'longer has ({", ".join(missing)}), so pola_mm kept '
                    'them out of mmpretrain.models (which would otherwise '
                    'fail to import, and mmdet.models and mmseg.models '
                    'with it). To use them, install transformers<5: '
                    'pip install "transformers<5"')

            registry.register_module(name=name, module=unavailable,
                                     force=True)

    return register


def patch_dependency_module(dependency) -> bool:
    """Run on ``mmpretrain.utils.dependency`` right after it loads: where
    ``WITH_MULTIMODAL`` is True and transformers lacks a name of
    :data:`MULTIMODAL_IMPORTS`, set it False and make the placeholders say
    why. Returns whether it patched."""
    if not getattr(dependency, 'WITH_MULTIMODAL', False):
        return False
    missing = missing_names()
    if not missing:
        return False
    try:
        from importlib.metadata import version
        tf_version = version('transformers')
    except Exception:
        tf_version = '(unknown version)'
    dependency.WITH_MULTIMODAL = False
    dependency.register_multimodal_placeholder = _placeholder_register(
        missing, tf_version)
    state['patched'] = missing
    return True


def install() -> str:
    """Run :func:`patch_dependency_module` when
    ``mmpretrain.utils.dependency`` loads (now, if it has). Returns
    ``'applied'`` or ``'deferred'``."""
    from pola_mm_startup import after_import
    return after_import('mmpretrain.utils.dependency',
                        patch_dependency_module)
