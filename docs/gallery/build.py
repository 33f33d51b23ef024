"""Build the paper gallery in this folder from the results of ``theory-kit figure all``.

    theory-kit figure all --jobs 2 --yes --out figures
    python docs/gallery/build.py figures            # -> docs/gallery/README.md, figN.png, figN.json

``--quick`` reads the quick results instead (figN_quick.*), for a preview into another folder:
``python docs/gallery/build.py figures /tmp/preview --quick``.  The work is done by
:func:`theory_kit.figures.gallery.build_gallery`; the agreement with the paper is read from
``agreement.md`` here (one ``## Figure N`` section per figure, written by a person).
"""
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parents[1]))      # this checkout's theory_kit, installed or not

from theory_kit.figures.gallery import main  # noqa: E402

if __name__ == "__main__":
    sys.exit(main(default_target=HERE))
