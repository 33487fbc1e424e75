"""The markers of timm's own ``tests/test_models.py``, which
``test_timm_suite.py`` runs: timm registers them in its own pytest
configuration, and this suite runs with ``--strict-markers`` (setup.cfg).
A timm release that adds a marker fails the suite's collection with its
name: add it here."""

#: timm 1.0.31's markers (and pytest-timeout's ``timeout``, which timm uses)
TIMM_MARKERS = ('base', 'cfg', 'cfg_nonstd', 'features', 'forward',
                'backward', 'fxforward', 'fxbackward', 'torchscript',
                'timeout')


def pytest_configure(config):
    known = {line.split(':')[0].strip()
             for line in config.getini('markers')}
    for name in TIMM_MARKERS:
        if name not in known:
            config.addinivalue_line(
                'markers', f'{name}: a marker of timm\'s own tests '
                '(tests/timm/test_timm_suite.py)')
