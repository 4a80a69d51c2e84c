"""`mccl plan`: predict the training step of a fleet of N Macs from one machine's compute profile.

    mccl plan --model vit_base_patch16_224 --batch 32 --rate 10gbit --hosts 1-48 --device mps
    mccl plan --model vit_base_patch16_224 --batch 32 --device mps --save-profile studio.json   # on one Mac
    mccl plan --profile studio.json --rate 10gbit --hosts 2,4,8,24                           # anywhere

Measuring a profile imports torch (and timm for a timm model); planning from a saved one does not. The
model and its parameters: lightning_mccl/plan and docs/scaling.md. Tables go to stdout, messages to stderr;
plan.csv, plan.md, plan.png (and the profile used, profile.json) go to --out.
"""
from __future__ import annotations

import argparse
import json
import os
import time
from typing import List, Optional, Sequence

from ..diloco.settings import AUTO
from ..plan.devices import MAC_DEVICE
from ..plan.link import EXCHANGE_EFFICIENCY, HOOK_LATENCY_S, OP_LATENCY_S, STEP_LATENCY_S, Link
from ..plan.methods import BF16, DDP, DILOCO_WIRES, METHODS, Int8, PowerSGD
from ..plan.predict import Settings, build_methods, on_model, predict
from ..plan.profile import ProfileError, load, save
from ..switch.rates import format_rate, line_rate_goodput, parse_rate
from ..tables import print_table
from .arg_types import goodput, hosts, positive_int, rate
from .console import make_log, stderr_console

EPILOG = """\
--hosts takes a range (1-48), a list (2,4,8,24) or both (1-8,16,24). --goodput takes bits (9.4gbit) or
bytes (1.17GB/s) per second: what `mccl doctor` measured between two Macs (its links' Gbit/s). A profile
measured on one device plans another with --compute-scale (0.5: twice as fast), an assumption the output
names. One host is one Mac training alone: no communication.
"""


def _names(text: str) -> List[str]:
    names = [t.strip() for t in text.split(",") if t.strip()]
    unknown = [n for n in names if n not in METHODS]
    if unknown or not names:
        raise argparse.ArgumentTypeError(f"{text!r}: methods are {', '.join(METHODS)}")
    return list(dict.fromkeys(names))


def _ranks(text: str) -> List[int]:
    try:
        ranks = sorted({int(t) for t in text.split(",")})
    except ValueError:
        ranks = []
    if not ranks or ranks[0] < 1:
        raise argparse.ArgumentTypeError(f"{text!r}: a list of PowerSGD ranks such as 1,4")
    return ranks


def _number(positive: bool, scale: float = 1.0, unit: str = ""):
    """An argparse type: a number (> 0 when `positive`, else >= 0) times `scale`."""
    def parse(text: str) -> float:
        try:
            value = float(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not a number{unit}") from None
        if not (value > 0 if positive else value >= 0):
            raise argparse.ArgumentTypeError(f"must be {'positive' if positive else 'at least 0'}, got {text}")
        return value * scale
    return parse


def _fragments(text: str):
    """--fragments: "auto" or an int >= 1."""
    return AUTO if text == AUTO else positive_int(text)


_positive_float = _number(True)
_micros = _number(False, 1e-6, " of microseconds")


def _json_object(text: str) -> dict:
    try:
        value = json.loads(text)
    except ValueError as e:
        raise argparse.ArgumentTypeError(f"{text!r} is not JSON ({e})") from None
    if not isinstance(value, dict):
        raise argparse.ArgumentTypeError(f"{text!r}: give a JSON object of keyword arguments")
    return value


def add_arguments(parser: argparse.ArgumentParser) -> None:
    s = Settings()
    g = parser.add_argument_group("what to plan")
    g.add_argument("--model", help="timm model name, or module:Class (a LightningModule with example_input_array)")
    g.add_argument("--batch", type=positive_int, help="samples per Mac per step")
    g.add_argument("--hosts", type=hosts, default=hosts("1-48"), help="fleet sizes (default: 1-48)")
    g.add_argument("--methods", type=_names, default=list(METHODS),
                   help=f"comma-separated, from {','.join(METHODS)} (default: all)")
    g.add_argument("--out", help="folder for plan.csv, plan.md, plan.png, profile.json (default: runs/plan/...)")
    g = parser.add_argument_group("the compute profile")
    g.add_argument("--device", choices=("auto", "mps", "cuda", "cpu"), help="where to measure it (default: auto)")
    g.add_argument("--profile", metavar="FILE", help="use this profile (made with --save-profile) instead")
    g.add_argument("--save-profile", metavar="FILE", help="write the profile used here")
    g.add_argument("--steps", type=positive_int, default=10, help="timed steps (default: %(default)s)")
    g.add_argument("--warmup", type=positive_int, default=3, help="untimed steps first (default: %(default)s)")
    g.add_argument("--share-device", type=positive_int, default=1, metavar="N",
                   help="N processes measure at once on the one device, as the fleet stand-in's ranks share "
                        "its GPU (default: 1, a Mac alone)")
    g.add_argument("--img-size", type=positive_int, default=224)
    g.add_argument("--patch-size", type=positive_int, help="ViT patch size (default: the model's)")
    g.add_argument("--depth", type=positive_int, help="number of blocks (default: the model's)")
    g.add_argument("--num-classes", type=positive_int, default=1000)
    g.add_argument("--init-args", type=_json_object, default={}, help="JSON keyword arguments for module:Class")
    g.add_argument("--optimizer", choices=("sgd", "adamw"), default="sgd", help="(default: %(default)s)")
    g.add_argument("--powersgd-ranks", type=_ranks, default=[1, 4], help="PowerSGD ranks to time (default: 1,4)")
    g.add_argument("--compute-scale", type=_positive_float, default=1.0,
                   help="multiply the profile's times by this (another device; an assumption; default: 1)")
    g = parser.add_argument_group("the fleet")
    g.add_argument("--rate", type=rate, default=parse_rate("10gbit"), help="link rate, tc style (default: 10gbit)")
    g.add_argument("--goodput", type=goodput,
                   help="TCP payload rate of a link, as `mccl doctor` measures it (default: the rate's line-rate "
                        "goodput with 1500-byte frames, 0.956 of it)")
    g.add_argument("--op-latency-us", type=_micros, default=OP_LATENCY_S,
                   help=f"the engine's cost per collective (default: {OP_LATENCY_S * 1e6:g})")
    g.add_argument("--hook-latency-us", type=_micros, default=HOOK_LATENCY_S,
                   help=f"more per collective from a Python comm hook (default: {HOOK_LATENCY_S * 1e6:g})")
    g.add_argument("--step-latency-us", type=_micros, default=STEP_LATENCY_S,
                   help=f"per algorithm step: a hop (default: {STEP_LATENCY_S * 1e6:g})")
    g = parser.add_argument_group("the methods (MCCLStrategy's defaults)")
    g.add_argument("--bucket-mb", type=_positive_float, default=s.bucket_mb, help="DDP's bucket_cap_mb (default: 5)")
    g.add_argument("--first-bucket-mb", type=_positive_float,
                   help="DDP's first bucket (default: --bucket-mb; DDP's own defaults are --bucket-mb 25 "
                        "--first-bucket-mb 1)")
    g.add_argument("--powersgd-rank", type=positive_int, default=s.powersgd_rank, help="(default: %(default)s)")
    g.add_argument("--powersgd-bucket-mb", type=_positive_float, default=s.powersgd_bucket_mb,
                   help="(default: %(default)g: one bucket)")
    g.add_argument("--int8-bucket-mb", type=_positive_float, default=s.int8_bucket_mb,
                   help="bucket_cap_mb with compress='int8' (default: %(default)g)")
    g.add_argument("--sync-every", type=positive_int, default=s.sync_every, metavar="H",
                   help="DiLoCo's inner steps per outer sync (default: %(default)s)")
    g.add_argument("--sync-delay", type=positive_int, default=s.sync_delay, metavar="TAU",
                   help="DiLoCo's steps between a round's end and its outer step (default: %(default)s)")
    g.add_argument("--fragments", type=_fragments, default=s.fragments, metavar="F",
                   help="DiLoCo's parts of the model, each synced on its own step of the round, or auto: min(H, the "
                        "model's parameter tensors) (default: %(default)s; 1: the whole model at the round's end)")
    g.add_argument("--diloco-wire", choices=DILOCO_WIRES, default=s.diloco_wire,
                   help="DiLoCo's pseudo-gradient on the wire, its compress= (default: %(default)s)")
    g.add_argument("--int8-codec", type=goodput,
                   help="the engine's int8 codec rate, wire bytes (default: as fast as the link)")


def run(args: argparse.Namespace, parser: argparse.ArgumentParser, command: Optional[Sequence[str]]) -> int:
    if command:
        parser.error("mccl plan takes no command")
    log = make_log(stderr_console(), "mccl plan")
    settings = Settings(bucket_mb=args.bucket_mb, first_bucket_mb=args.first_bucket_mb,
                        powersgd_rank=args.powersgd_rank, powersgd_bucket_mb=args.powersgd_bucket_mb,
                        int8_bucket_mb=args.int8_bucket_mb, sync_every=args.sync_every, sync_delay=args.sync_delay,
                        fragments=args.fragments, diloco_wire=args.diloco_wire, int8_codec_Bps=args.int8_codec)
    link = Link(args.goodput or line_rate_goodput(args.rate) / 8, args.op_latency_us,
                           args.step_latency_us, args.hook_latency_us)
    if args.profile:
        try:
            profile = load(args.profile)
        except ProfileError as e:
            parser.error(str(e))
        for option, given, measured in (("--model", args.model, profile.model), ("--batch", args.batch, profile.batch),
                                        ("--device", args.device, profile.device)):
            if given is not None and given != measured and not (option == "--device" and given == "auto"):
                parser.error(f"{option} {given}, but the profile {args.profile} was measured with {measured}: "
                             f"leave {option} out, or measure a profile for it")
    else:
        if not args.model or not args.batch:
            parser.error("give --model and --batch (to measure a profile here) or --profile FILE")
        profile = _measure(args, parser, log)
        if profile is None:
            return 1
    if args.save_profile:
        save(profile, args.save_profile)
        log(f"wrote the profile to {args.save_profile}")
    if args.compute_scale != 1.0:
        profile = profile.scaled(args.compute_scale)
    try:
        settings = on_model(settings, profile)
        methods = build_methods(args.methods, settings)
        predictions = predict(profile, link, methods, args.hosts)
        ddp = predict(profile, link, build_methods([DDP.name], settings), [max(args.hosts)])
    except ValueError as e:
        parser.error(str(e))
    from ..plan import accuracy, report

    out = args.out or os.path.join("runs", "plan", f"{profile.model.replace(':', '.')}-b{profile.batch}-"
                                                   f"{time.strftime('%Y%m%d-%H%M%S')}")
    unit = "Mac" if profile.device == MAC_DEVICE else "host"
    title = f"mccl plan: {profile.model}, batch {profile.batch} per {unit}, {format_rate(args.rate)} links"
    notes = assumptions(profile, link, args, settings, methods, unit)
    hosts, steps = accuracy.largest_fleet(predictions, ddp)
    more, why_not = accuracy.rows(args.methods, settings, hosts, steps)
    warning = device_warning(profile)
    key = ([f"WARNING: {warning}"] if warning else []) + [report.cell_key(unit), accuracy.KEY, accuracy.time_key(hosts)]
    why = report.write(out, title, key, notes + why_not, predictions, more, {
        "model": profile.model, "batch": profile.batch, "device": profile.device, "device_name": profile.device_name,
        "share_device": profile.share_device, "compute_scale": profile.compute_scale, "rate_bps": args.rate,
        "goodput_Bps": link.goodput_Bps}, unit)
    save(profile, os.path.join(out, "profile.json"))
    print_table(title, report.table(predictions, more), why_not + notes, key)
    if warning:
        log(f"[warning] {warning}")
    if why:
        log(why)
    log(f"wrote {out}/plan.csv, plan.md{'' if why else ', plan.png'}, profile.json")
    return 0


def _measure(args, parser, log):
    from ..plan.devices import DeviceError, pick
    from ..plan.measure import MeasureError, MeasureSpec, measure
    from ..plan.models import ModelError, ModelSpec

    try:
        device = pick(args.device or "auto")
    except DeviceError as e:
        parser.error(str(e))
    spec = MeasureSpec(ModelSpec(args.model, args.img_size, args.patch_size, args.depth, args.num_classes,
                                 args.init_args), args.batch, device, args.steps, args.warmup, args.share_device,
                       args.optimizer, tuple(args.powersgd_ranks))
    start = time.monotonic()
    try:
        profile = measure(spec, log)
    except ModelError as e:
        parser.error(str(e))
    except MeasureError as e:
        log(str(e))
        return None
    log(f"measured in {time.monotonic() - start:.0f} s: compute step {profile.step_s * 1e3:.1f} ms")
    return profile


def device_warning(profile) -> Optional[str]:
    """Why the plan's compute times are not a Mac's, when the profile was not measured on a Mac's GPU."""
    if profile.device == MAC_DEVICE:
        return None
    scaled = (f", its times x{profile.compute_scale:g} (--compute-scale: an assumption about a Mac)"
              if profile.compute_scale != 1.0 else "")
    return (f"the profile was measured on {profile.device_name} ({profile.device}){scaled}, not on a Mac's GPU "
            f"(mps): every step, samples/s, efficiency and speed-up below is that device's compute, not a Mac's. "
            f"On a Mac: mccl plan --model ... --batch ... --device mps --save-profile mac.json, then plan from "
            f"--profile mac.json anywhere.")


def assumptions(profile, link, args, settings, methods, unit: str) -> List[str]:
    """What the prediction rests on, one line each, for the table's notes and plan.md."""
    from ..plan.buckets import MIB

    params = sum(p.numel for p in profile.params)
    shared = f", {profile.share_device} processes sharing it" if profile.share_device > 1 else ""
    scale = (f"; every compute time x{profile.compute_scale:g} (an assumption: another device)"
             if profile.compute_scale != 1.0 else "")
    lines = [f"profile: {params / 1e6:.2f}M parameters ({profile.grad_bytes / 1e6:.1f} MB of gradients), measured on "
             f"{profile.device_name} ({profile.device}{shared}), {profile.optimizer}: forward "
             f"{profile.forward_s * 1e3:.1f} ms, backward to {profile.backward_s * 1e3:.1f} ms, step "
             f"{profile.step_s * 1e3:.1f} ms{scale}",
             f"link: {format_rate(args.rate)}, TCP goodput {link.goodput_Bps / 1e9:.3f} GB/s"
             f"{' (given)' if args.goodput else ' (0.956 of the rate, as the emulated switch measured)'}; engine: "
             f"{link.op_latency_s * 1e6:g} us per collective (+{link.hook_latency_s * 1e6:g} from a Python hook), "
             f"{link.step_latency_s * 1e6:g} us per ring step"]
    for m in methods:
        first = getattr(m, "first_cap_bytes", 0)
        first = f" (the first {first / MIB:g})" if first and first != m.cap_bytes else ""
        if m.name in (DDP.name, BF16.name, Int8.name):
            shares = ", ".join(f"{share:g} up to {ranks} hosts" if ranks else f"{share:g} above"
                               for ranks, share in EXCHANGE_EFFICIENCY)
            how = {Int8.name: ", the 8-bit exchange at " + (format_rate(settings.int8_codec_Bps * 8) + " (given)"
                                                          if settings.int8_codec_Bps else
                                                          f"the share of the goodput the stand-in measured ({shares})")}
            lines.append(f"{m.name}: {len(m.buckets(profile))} buckets of {m.cap_bytes / MIB:g} MiB{first}, "
                         f"their allreduces overlapping the backward pass{how.get(m.name, '')}")
        elif m.name == PowerSGD.name:
            lines.append(f"{m.name}: rank {settings.powersgd_rank}, {len(m.buckets(profile))} bucket(s) of "
                         f"{m.cap_bytes / MIB:g} MiB{first}, same-shaped matrices batched")
        else:
            auto = f" (fragments {AUTO}: min(H, the model's {len(profile.params)} parameter tensors))" \
                if args.fragments == AUTO else ""
            pieces = (f"in one allreduce at the round's end{auto}" if settings.fragments == 1 else
                      f"in {settings.fragments} allreduces{auto}, one fragment of the model each, on the round's "
                      f"staggered steps")
            lines.append(f"diloco: H = {settings.sync_every} inner steps per outer sync, the pseudo-gradient as "
                         f"{settings.diloco_wire} {pieces}, each overlapping the next {settings.sync_delay} "
                         f"step(s) before its outer step applies it; the step is a round's average")
    lines.append(f"one host: one {unit} training alone; efficiency = its step / this step; speed-up = hosts x "
                 "efficiency")
    return lines
