"""Build step of pola_mm that setup.cfg cannot express.

The metadata is in setup.cfg. This file only adds ``pola_mm_startup.pth``
to the root of what is installed (site-packages), for a regular wheel and
for an editable install (``pip install -e .``) alike. Its one line runs
:func:`pola_mm_startup.install` at interpreter start, which lets
mmengine's config reader read ``pola_mm::`` entries in programs that never
import pola_mm. What it changes: docs/install.md ("the start-up hook").
"""
import os
from setuptools import setup
from setuptools.command.build_py import build_py

PTH_NAME = 'pola_mm_startup.pth'
PTH_TEXT = 'import pola_mm_startup; pola_mm_startup.install()\n'


class BuildPyWithStartupHook(build_py):
    """``build_py`` that also writes :data:`PTH_NAME`.

    A regular wheel is made of ``build_lib``, so the file goes there. An
    editable wheel is made of the folder the ``install`` command targets
    (setuptools' ``editable_wheel`` points ``install_lib`` at the unpacked
    wheel, where it also puts data files and scripts) and drops
    ``build_lib``, so in ``editable_mode`` the file goes there.
    """

    def run(self) -> None:
        super().run()
        self.mkpath(self._pth_dir())
        path = os.path.join(self._pth_dir(), PTH_NAME)
        with open(path, 'w', encoding='utf-8') as f:
            f.write(PTH_TEXT)

    def _pth_dir(self) -> str:
        if getattr(self, 'editable_mode', False):
            return self.get_finalized_command('install').install_lib
        return self.build_lib

    def get_outputs(self, include_bytecode=True):
        outputs = super().get_outputs(include_bytecode)
        if not getattr(self, 'editable_mode', False):
            outputs.append(os.path.join(self.build_lib, PTH_NAME))
        return outputs


setup(cmdclass={'build_py': BuildPyWithStartupHook})
