"""`mccl doctor`'s checks of what a Mac does to a long GPU run, from canned macOS command outputs (pmset -g,
pmset -g assertions/therm/batt, system_profiler SPDisplaysDataType, stat /dev/console, ioreg IOAccelerator, a
panic report in a folder standing in for /Library/Logs/DiagnosticReports): each check's named advice, and a
well set up Mac passing them all. None of these outputs was taken on a Mac here: they follow the tools' public
documentation and published examples (docs/macs.md, *Long runs on macOS 26*)."""
from __future__ import annotations

import json
import os
import time

from lightning_mccl.launcher import host_probe
from lightning_mccl.launcher.host_checks import FAIL, OK, WARN, judge
from test_host_checks import mac_probe

PMSET = """System-wide power settings:
Currently in use:
 standby              0
 Sleep On Power Button 1
 hibernatefile        /var/vm/sleepimage
 powernap             1
 networkoversleep     0
 disksleep            10
 sleep                0
 ttyskeepawake        1
 displaysleep         {display}
 tcpkeepalive         1
 lowpowermode         {low}
 womp                 1
"""
PMSET_LAPTOP = PMSET.replace(" lowpowermode         {low}\n", " powermode            {mode}\n")
ASSERTIONS = """2026-06-27 10:00:00 +0200
Assertion status system-wide:
   BackgroundTask                 0
   ApplePushServiceTask           0
   UserIsActive                   {active}
   PreventUserIdleDisplaySleep    {holders}
   PreventSystemSleep             0
   ExternalMedia                  0
   PreventUserIdleSystemSleep     1
   NetworkClientActive            0
Listed by owning process:
   pid 412(sharingd): [0x0004472300098c2f] 00:12:34 PreventUserIdleSystemSleep named: "Handoff"
{extra}See man pmset and man caffeinate for more details.
"""
DISPLAY_ON = ('   pid 80(powerd): [0x00044f2f00019216] 00:22:34 PreventUserIdleSystemSleep named: "Powerd - Prevent sleep '
              'while display is on"\n')
CAFFEINATE_D = ('   pid 5123(caffeinate): [0x00045477000194b3] 00:01:02 PreventUserIdleDisplaySleep named: "caffeinate '
                'command-line tool"\n        Details: caffeinate asserting forever\n')
HEADLESS = json.dumps({"SPDisplaysDataType": [{"_name": "Apple M2 Ultra", "sppci_model": "Apple M2 Ultra",
                                               "sppci_cores": "76"}]})
ONE_DISPLAY = json.dumps({"SPDisplaysDataType": [{"_name": "Apple M2 Ultra", "sppci_model": "Apple M2 Ultra",
                                                  "spdisplays_ndrvs": [{"_name": "Studio Display",
                                                                        "spdisplays_main": "spdisplays_yes",
                                                                        "spdisplays_online": "spdisplays_yes"}]}]})
THERM_NOMINAL = """Note: No thermal warning level has been recorded
Note: No performance warning level has been recorded
Note: No CPU power status has been recorded
"""
THERM_HOT = """Note: No thermal warning level has been recorded
Note: No performance warning level has been recorded
2026-06-27 10:12:19 +0200 CPU Power notify
\tCPU_Scheduler_Limit \t= 100
\tCPU_Available_CPUs \t= 24
\tCPU_Speed_Limit \t= 71
"""
AC = "Now drawing from 'AC Power'\n"
BATTERY = "Now drawing from 'Battery Power'\n -InternalBattery-0 (id=29491299)\t83%; discharging; 4:12 remaining present: true\n"
IOREG = """+-o AGXAcceleratorG14D  <class AGXAcceleratorG14D, id 0x1000007b6, registered, matched, active, busy 0>
    {{
      "PerformanceStatistics" = {{"In use system memory"=28442624,"Tiler Utilization %"=0,"Renderer Utilization %"={u},\
"Device Utilization %"={u},"Alloc system memory"=1409286144}}
    }}
"""
PANIC = ('{"bug_type":"210","timestamp":"2026-06-27 10:15:18.00 +0200","os_version":"macOS 26.5.1 (25F80)"}\n'
         + json.dumps({"build": "macOS 26.5.1 (25F80)", "product": "Mac17,7",
                       "panicString": "panic(cpu 4 caller 0xfffffe0029a1c2b0): watchdog timeout: no checkins from "
                                      "watchdogd in 93 seconds (23 total checkins since monitoring last enabled)\n"
                                      "Debugger message: panic\nMemory ID: 0x6\n"}, indent=2))


def good_mac(**changes):
    """The outputs of a Mac Studio set up for long runs (headless, nobody at the console, AC power, nominal), with
    `changes` to them."""
    outputs = {"pmset": [0, PMSET.format(display=10, low=0)], "assertions": [0, ASSERTIONS.format(
        active=0, holders=0, extra="")], "displays": [0, HEADLESS], "console": [0, "root\n"],
        "therm": [0, THERM_NOMINAL], "batt": [0, AC], "gpu": [0, IOREG.format(u=2)],
        "chip": [0, "Apple M2 Ultra\n"], "macos": [0, "26.5.1\n"], "firewall": [0, "Firewall is disabled. (State = 0)\n"],
        "xcode": [0, "/Library/Developer/CommandLineTools\n"]}
    outputs.update(changes)
    return outputs


def checks(outputs, panic_dir="/nonexistent", **probe):
    got = mac_probe(outputs, panic_dir=panic_dir)
    got.update(probe)
    return {f.check: f for f in judge("studio-03", got)}


def test_a_headless_mac_on_ac_power_passes_every_check():
    got = checks(good_mac())
    assert {c: got[c].state for c in ("display", "watchdog", "power", "thermal", "GPU load")} == dict.fromkeys(
        ("display", "watchdog", "power", "thermal", "GPU load"), OK)
    assert got["display"].detail == ("0 displays attached (headless); off now; sleeps after 10 min idle; nobody logged "
                                     "in at the console: no awake display, which macOS 26's GPU watchdog needs")
    assert got["power"].detail == "Low Power Mode off; on AC power"
    assert got["GPU load"].detail == "GPU 2% busy before the job"


def test_an_awake_display_gets_both_watchdog_fixes_with_their_costs():
    awake = checks(good_mac(displays=[0, ONE_DISPLAY], console=[0, "me\n"], assertions=[0, ASSERTIONS.format(
        active=1, holders=0, extra=DISPLAY_ON)]))["display"]
    assert awake.state == WARN
    assert awake.detail.startswith("1 display attached (Studio Display); on now; sleeps after 10 min idle; me logged "
                                   "in at the console: on macOS 26 sustained GPU work while a display is awake is "
                                   'killed ("Impacting Interactivity") or panics the Mac'), awake.detail
    assert awake.fix.startswith("pmset displaysleepnow (on that Mac, right before training); last resort: `mccl launch "
                                "--env AGX_RELAX_CDM_CTXSTORE_TIMEOUT=1` relaxes the GPU watchdog on most Macs, at a cost "
                                "to the responsiveness of the Mac's own screen"), awake.fix
    never = checks(good_mac(displays=[0, ONE_DISPLAY], pmset=[0, PMSET.format(display=0, low=0)]))["display"]
    assert never.state == WARN and "never sleeps (displaysleep 0)" in never.detail
    assert never.fix.startswith("sudo pmset -a displaysleep 1, and `pmset displaysleepnow` before training")
    held = checks(good_mac(displays=[0, ONE_DISPLAY], assertions=[0, ASSERTIONS.format(
        active=0, holders=1, extra=DISPLAY_ON + CAFFEINATE_D)]))["display"]
    assert held.state == WARN and "kept awake by caffeinate (pid 5123)" in held.detail
    assert held.fix.startswith("quit caffeinate (pid 5123) before training (let the display sleep while it trains")
    asleep = checks(good_mac(displays=[0, ONE_DISPLAY]))["display"]
    assert asleep.state == OK and asleep.detail.startswith("1 display attached (Studio Display); off now")
    relaxed = checks(good_mac(displays=[0, ONE_DISPLAY], pmset=[0, PMSET.format(display=0, low=0)]),
                     relax_watchdog="1")["display"]
    assert "AGX_RELAX_CDM_CTXSTORE_TIMEOUT=1" in relaxed.detail


def test_a_watchdog_panic_after_a_reboot_is_found_in_the_diagnostic_reports(tmp_path):
    report = tmp_path / "panic-full-2026-06-27-101518.0002.panic"
    report.write_text(PANIC)
    hours_ago = time.time() - 5 * 3600
    os.utime(report, (hours_ago, hours_ago))
    old = tmp_path / "panic-full-2026-05-01-080000.0001.panic"
    old.write_text(PANIC)
    os.utime(old, (time.time() - 30 * 86400,) * 2)
    (tmp_path / "WindowServer-2026-06-27-101000.ips").write_text("not a panic")
    panics = host_probe.panic_reports(str(tmp_path))
    assert [p[0] for p in panics] == [report.name]  # the old one and the .ips are left out
    assert panics[0][2] == ("panic(cpu 4 caller 0xfffffe0029a1c2b0): watchdog timeout: no checkins from watchdogd in "
                            "93 seconds (23 total checkins since monitoring last enabled) Debugger message: panic "
                            "Memory ID: 0x6")
    found = checks(good_mac(), panic_dir=str(tmp_path))["watchdog"]
    assert found.state == FAIL
    assert found.detail.startswith(f"1 kernel panic in the last days, the latest watchdog one 5 h ago ({report.name}: "
                                   "panic(cpu 4 caller"), found.detail
    assert "the Mac rebooted under the watchdog, as sustained GPU work with an awake display does on macOS 26" \
        in found.detail
    assert found.fix.startswith("let the display sleep while it trains (`pmset displaysleepnow`, or run headless over "
                                "ssh); `mccl launch --env AGX_RELAX_CDM_CTXSTORE_TIMEOUT=1`"), found.fix
    assert checks(good_mac(), panics="cannot list /Library/Logs/DiagnosticReports: Permission denied")[
        "watchdog"].state == WARN
    other = tmp_path / "other"
    other.mkdir()
    (other / "panic-full-2026-06-27-090000.0001.panic").write_text(PANIC.replace(
        "watchdog timeout: no checkins from watchdogd in 93 seconds", "Kernel data abort. at pc 0xfffffe0012345678"))
    abort = checks(good_mac(), panic_dir=str(other))["watchdog"]
    assert abort.state == WARN and "the latest one 0 h ago" in abort.detail and abort.detail.endswith(": it rebooted")
    assert abort.fix == "read /Library/Logs/DiagnosticReports/panic-full-2026-06-27-090000.0001.panic on studio-03"


def test_low_power_mode_automatic_on_battery_and_a_thermal_limit_are_named():
    low = checks(good_mac(pmset=[0, PMSET.format(display=10, low=1)]))["power"]
    assert (low.state, low.fix) == (WARN, "sudo pmset -a lowpowermode 0")
    assert low.detail.startswith("Low Power Mode on; on AC power: it caps sustained GPU speed while the thermal state "
                                 "still reads nominal"), low.detail
    battery = checks(good_mac(pmset=[0, PMSET_LAPTOP.format(display=10, mode=0)], batt=[0, BATTERY]))["power"]
    assert battery.state == WARN
    assert battery.detail == "power mode Automatic; on battery: Automatic favours the battery over speed"
    assert battery.fix == "connect its power adapter (or System Settings > Battery > Energy Mode: High Power)"
    high = checks(good_mac(pmset=[0, PMSET_LAPTOP.format(display=10, mode=2)], batt=[0, BATTERY]))["power"]
    assert (high.state, high.detail) == (OK, "power mode High Power; on battery")
    low_mode = checks(good_mac(pmset=[0, PMSET_LAPTOP.format(display=10, mode=1)]))["power"]
    assert low_mode.state == WARN and low_mode.fix.startswith("sudo pmset -a powermode 0")
    hot = checks(good_mac(therm=[0, THERM_HOT]))["thermal"]
    assert (hot.state, hot.detail) == (WARN, "pmset -g therm: CPU speed limit 71%: macOS slows the Mac to cool it")
    assert checks(good_mac(therm=[0, "Thermal warning level: 2\n"]))["thermal"].detail.startswith(
        "pmset -g therm: thermal warning level 2")
    busy = checks(good_mac(gpu=[0, IOREG.format(u=87)]))["GPU load"]
    assert busy.state == WARN and busy.detail.startswith("GPU 87% busy before anything of the job runs")
