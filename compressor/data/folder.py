"""A user's own image folder (dataset `folder`): DATASET_DIR/train/<class>/* and/or val/<class>/*.

The classes are the class folders' names, sorted (torchvision's ImageFolder order): train/'s,
or val/'s where there is no train/; with both, they must name the same classes. A model's
recorded class names (its checkpoint's) give the label order instead. Training needs train/;
without val/ the part of train/ that --vs holds out is also the test split. Evaluation reads
val/ only. Every image is opened (header and structure, not pixels) when the dataset loads, so
that a file PIL cannot read is refused before the run writes anything. Hidden folders
(.ipynb_checkpoints) are no class. `infer_dataset` tells such a folder from ImageNet's.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from compressor.data.imagenet import ClassFolder, empty_class_folders, image_problem
from compressor.data.imagenet_classes import check_known, class_folders, imagenet_wnids
from compressor.data.splits import LoadRequest, RawSplits
from compressor.utils.dataset_table import FOLDER
from compressor.utils.errors import DataError, UsageError
from compressor.utils.progress import heartbeat

__all__ = ["SPLIT_DIRS", "split_class_folders", "infer_dataset", "folder_classes",
           "folder_num_classes", "load_folder_dataset"]

SPLIT_DIRS = ("train", "val")
_LAYOUT = "DATASET_DIR/train/<class>/ images (and DATASET_DIR/val/<class>/)"
_EMPTY_HINT = "put images in every class folder, or remove the empty ones"
MAX_LISTED = 8  # problems named in the one line that reports a folder's problems together


def _sample(names: Sequence[str]) -> str:
    return ", ".join(names[:3]) + (" ..." if len(names) > 3 else "")


def _visible_folders(directory: Path) -> list[str]:
    return [name for name in class_folders(directory) if not name.startswith(".")]


def split_class_folders(root: Path) -> dict[str, list[str]]:
    """The sorted, visible class folders of root/train and root/val, for those that exist."""
    return {split: _visible_folders(root / split) for split in SPLIT_DIRS
            if (root / split).is_dir()}


def infer_dataset(root: str | Path) -> str | None:
    """The dataset a DATASET_DIR of class folders holds: 'imagenet' when they are all ImageNet
    WordNet ids, 'folder' when none is; None for another layout (CIFAR batches, IDX files)."""
    root = Path(root).expanduser()
    if not root.is_dir():
        return None  # the loader names the missing directory
    names = sorted({name for folders in split_class_folders(root).values() for name in folders})
    if not names:
        return None
    wnids = set(imagenet_wnids())
    known = [name for name in names if name in wnids]
    if len(known) == len(names):
        return "imagenet"
    if not known:
        return FOLDER
    others = [name for name in names if name not in wnids]
    raise DataError(f"{root} mixes ImageNet WordNet-id class folders ({_sample(known)}) with "
                    f"other names ({_sample(others)}); name every folder by wnid for ImageNet, "
                    f"or pass --dataset {FOLDER} to take each folder as a class of your own")


def _check_same_classes(root: Path, train: Sequence[str], val: Sequence[str]) -> None:
    for where, other, extra in (("val", "train", sorted(set(val) - set(train))),
                                ("train", "val", sorted(set(train) - set(val)))):
        if extra:
            raise DataError(f"{root / where} has class folders that {root / other} lacks: "
                            f"{_sample(extra)}; give train/ and val/ the same class folders")


def folder_classes(root: Path) -> tuple[str, ...]:
    """The classes in label order: train/'s class folders (else val/'s), sorted; where both
    splits exist they must have the same class folders."""
    folders = split_class_folders(root)
    if not folders:
        raise DataError(f"no train/ or val/ folder in {root}; expected {_LAYOUT}")
    for split, names in folders.items():
        if not names:
            raise DataError(f"no class folders in {root / split}; expected {_LAYOUT}")
    if len(folders) == len(SPLIT_DIRS):
        _check_same_classes(root, folders["train"], folders["val"])
    return tuple(folders.get("train") or folders["val"])


def _checked_root(root: str | Path | None) -> Path:
    if root is None or str(root) == "":
        raise UsageError(f"dataset '{FOLDER}' reads your image folders; pass DATASET_DIR, the "
                         "directory that holds train/<class>/ (and val/<class>/)")
    path = Path(root).expanduser()
    if not path.is_dir():
        raise DataError(f"DATASET_DIR {path} does not exist or is not a directory; check the "
                        f"path (it holds {_LAYOUT})")
    return path


def folder_num_classes(root: str | Path | None, requested: int | None) -> int:
    """The model's classes for a folder dataset: the number of class folders, or --num-classes
    (`requested`) when it is at least that many (a model may have spare outputs)."""
    path = _checked_root(root)
    count = len(folder_classes(path))
    if requested is None:
        return count
    if requested < count:
        raise UsageError(f"--num-classes {requested} is fewer than the {count} class folders of "
                         f"{path}; pass --num-classes {count} or more, or drop it")
    return requested


def _images(path: Path, order: Sequence[str], source: str) -> ClassFolder:
    """The images of one split, labelled by `order`; its folders must all be known (what they
    hold is checked with the other split's, `_check_splits`)."""
    folders = _visible_folders(path)
    if not folders:
        raise DataError(f"no class folders in {path}; expected {_LAYOUT}")
    check_known(folders, order, path, source)
    return ClassFolder(str(path), order)


def _problems(dataset: ClassFolder) -> list[str]:
    """What a split's folders hold that a run cannot use: empty class folders, images PIL
    cannot read (every one of them, found before anything is written)."""
    path = Path(dataset.root)
    problems = [f"no images in {path / name}"
                for name in empty_class_folders(dataset, _visible_folders(path))]
    for file, _ in heartbeat(dataset.samples, f"checking the images of {path}", unit="images"):
        reason = image_problem(file)
        if reason is not None:
            problems.append(f"corrupt image file {file}: {reason}")
    return problems


def _check_splits(root: Path, *splits: ClassFolder | None) -> None:
    """Refuse the splits' problems, all of them in one line."""
    problems = [problem for split in splits if split is not None for problem in _problems(split)]
    if problems:
        raise DataError(_together(root, problems))


def _together(path: Path, problems: Sequence[str]) -> str:
    """Every problem of a folder dataset in one line, with what to do about each kind."""
    fixes = [fix for kind, fix in (("no images in", _EMPTY_HINT),
                                   ("corrupt image file", "remove or replace the corrupt files"))
             if any(problem.startswith(kind) for problem in problems)]
    if len(problems) == 1:
        return f"{problems[0]}; {fixes[0] if fixes[0] == _EMPTY_HINT else 'remove or replace it'}"
    shown = "; ".join(problems[:MAX_LISTED])
    more = f"; and {len(problems) - MAX_LISTED} more" if len(problems) > MAX_LISTED else ""
    return (f"{len(problems)} problems in the image folder {path}, all listed (fix them all, "
            f"then run again): {shown}{more}; {' and '.join(fixes)}")


def _missing(path: Path, reading: str, fix: str) -> DataError:
    """DATASET_DIR without the split a run reads, and what to do."""
    return DataError(f"missing {path}; {reading} reads {path.name}/<class>/ images: {fix}")


def load_folder_dataset(request: LoadRequest) -> RawSplits:
    """Raw (PIL RGB image, label) splits: train and val (val None when there is no val/: the
    --vs split stands in), or val alone when evaluating."""
    assert request.root is not None  # the folder dataset needs DATASET_DIR
    root = request.root
    if request.class_names:
        order, source = tuple(request.class_names), "the model's classes (its checkpoint's)"
    else:
        order, source = folder_classes(root), "the dataset's classes"
    train = val = None
    if request.train:
        if not (root / "train").is_dir():
            raise _missing(root / "train", "training", (
                f"put them in {root / 'train'}/<class>/ (one folder per class), or check that "
                f"DATASET_DIR is the directory above train/"))
        train = _images(root / "train", order, source)
        if (root / "val").is_dir():
            if request.class_names:  # the same classes in both splits, as without a record
                folders = split_class_folders(root)
                _check_same_classes(root, folders["train"], folders["val"])
            val = _images(root / "val", order, source)
        _check_splits(root, train, val)
    else:
        if not (root / "val").is_dir():
            raise _missing(root / "val", "evaluation (-e)", (
                f"add {root / 'val'}/<class>/ images held out from training, in the class "
                "folders of train/ (a training run without val/ holds out --vs of train/ "
                "and tests on it)"))
        val = _images(root / "val", order, source)
        _check_splits(root, val)
    return RawSplits(train, val, len(order), order)
