"""Drives headless Chromium as a person would, over the DevTools protocol on a pipe (no
WebDriver, no packages: the standard library only), and prints what each step showed.

Usage: browser.py STEPS.json

STEPS.json: {"shots": DIR, "steps": [...]}, each step one of
  {"goto": URL}                      open a page and wait until it has loaded
  {"click": SELECTOR}                press the element with the mouse (a real click at its
                                     centre); when it submits a form, wait for the next page
  {"wait": EXPRESSION}               evaluate the JavaScript expression until it is true (a page
                                     that renders after loading)
  {"capture": NAME}                  record the page's URL, title and visible text, the requests
                                     it made since it was opened ({"url", "blocked": the reason
                                     the browser refused it, as "csp", or null}), and a screenshot
                                     DIR/NAME.png; with "html": true, its DOM as HTML too
Every step may take "seconds" (30 by default): Chromium must answer all of the step within it
(a page whose scripts keep the browser busy for long, on a loaded machine, needs more).
Prints {"captures": [{"name", "url", "title", "text", "requests", "screenshot"[, "html"]}]}
as JSON.
"""

import base64
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time

TIMEOUT = 30


class Browser:
    def __init__(self):
        binary = os.environ.get("TEST_CHROMIUM", "chromium")
        commands_read, self.commands = os.pipe()
        self.replies, replies_write = os.pipe()
        profile = tempfile.mkdtemp(prefix="chromium-profile-")
        self.profile = profile

        def wire_pipes():
            # Chromium reads commands from fd 3 and writes replies to fd 4. Every other
            # descriptor of ours is close-on-exec (os.pipe's), so only these two are inherited.
            os.dup2(commands_read, 3)
            os.dup2(replies_write, 4)
            os.set_inheritable(3, True)
            os.set_inheritable(4, True)

        self.process = subprocess.Popen(
            [binary, "--headless", "--no-sandbox", "--disable-gpu", "--no-first-run",
             "--disable-background-networking", "--disable-component-update", "--disable-sync",
             "--hide-scrollbars", "--window-size=1000,900", f"--user-data-dir={profile}",
             "--remote-debugging-pipe", "about:blank"],
            close_fds=False, preexec_fn=wire_pipes,
            stdout=subprocess.DEVNULL, stderr=None if os.environ.get("TEST_LOG") else subprocess.DEVNULL,
        )
        os.close(commands_read)
        os.close(replies_write)
        self.buffer = b""
        self.step(TIMEOUT)
        self.next_id = 0
        self.events = []
        self.requests = []
        target = self.call("Target.createTarget", {"url": "about:blank"})["targetId"]
        self.session = self.call("Target.attachToTarget", {"targetId": target, "flatten": True})["sessionId"]
        self.call("Page.enable", session=True)
        self.call("Network.enable", session=True)

    def send(self, method, params, session):
        self.next_id += 1
        message = {"id": self.next_id, "method": method, "params": params or {}}
        if session:
            message["sessionId"] = self.session
        os.write(self.commands, json.dumps(message).encode() + b"\0")
        return self.next_id

    def receive(self, awaited):
        while b"\0" not in self.buffer:
            if time.monotonic() > self.deadline:
                raise SystemExit(f"chromium did not answer {awaited} within the step's {self.seconds} s")
            chunk = os.read(self.replies, 1 << 16)
            if not chunk:
                raise SystemExit("chromium closed the pipe")
            self.buffer += chunk
        message, self.buffer = self.buffer.split(b"\0", 1)
        message = json.loads(message)
        method, params = message.get("method"), message.get("params", {})
        if method == "Network.requestWillBeSent":
            self.requests.append({"id": params["requestId"], "url": params["request"]["url"], "blocked": None})
        elif method == "Network.loadingFailed" and params.get("blockedReason"):
            for request in self.requests:
                if request["id"] == params["requestId"]:
                    request["blocked"] = params["blockedReason"]
        return message

    def call(self, method, params=None, session=False):
        wanted = self.send(method, params, session)
        while True:
            message = self.receive(method)
            if message.get("id") == wanted:
                if "error" in message:
                    raise SystemExit(f"{method} failed: {message['error']}")
                return message.get("result", {})
            self.events.append(message)

    def wait_for(self, event):
        while True:
            for index, message in enumerate(self.events):
                if message.get("method") == event:
                    del self.events[: index + 1]
                    return message
            self.events.append(self.receive(event))

    def evaluate(self, expression):
        result = self.call("Runtime.evaluate", {"expression": expression, "returnByValue": True}, session=True)
        if "exceptionDetails" in result:
            raise SystemExit(f"{expression} failed: {result['exceptionDetails']}")
        return result["result"].get("value")

    def goto(self, url):
        self.events.clear()
        self.requests.clear()
        self.call("Page.navigate", {"url": url}, session=True)
        self.wait_for("Page.loadEventFired")

    def step(self, seconds):
        """Starts a step: every call of it must be answered within `seconds` of now."""
        self.seconds = seconds
        self.deadline = time.monotonic() + seconds

    def wait(self, expression):
        while not self.evaluate(f"!!({expression})"):
            if time.monotonic() > self.deadline:
                raise SystemExit(f"{expression} was not true within {self.seconds} s")
            time.sleep(0.2)

    def click(self, selector):
        point = self.evaluate(
            "(() => { const element = document.querySelector(%s);"
            " if (!element) return null; element.scrollIntoView({block: 'center'});"
            " const box = element.getBoundingClientRect();"
            " return [box.x + box.width / 2, box.y + box.height / 2,"
            " !!element.closest('form') && (element.type === 'submit' || element.tagName === 'BUTTON')]; })()"
            % json.dumps(selector)
        )
        if point is None:
            raise SystemExit(f"nothing matches {selector!r} on {self.evaluate('location.href')}")
        x, y, submits = point
        self.events.clear()
        for kind in ("mousePressed", "mouseReleased"):
            self.call("Input.dispatchMouseEvent",
                      {"type": kind, "x": x, "y": y, "button": "left", "clickCount": 1}, session=True)
        if submits:
            self.wait_for("Page.loadEventFired")

    def capture(self, name, shots, html):
        path = os.path.join(shots, f"{name}.png")
        data = self.call("Page.captureScreenshot", {"format": "png"}, session=True)["data"]
        with open(path, "wb") as file:
            file.write(base64.b64decode(data))
        captured = {
            "name": name,
            "url": self.evaluate("location.href"),
            "title": self.evaluate("document.title"),
            "text": self.evaluate("document.body ? document.body.innerText : ''"),
            "requests": [{"url": r["url"], "blocked": r["blocked"]} for r in self.requests],
            "screenshot": path,
        }
        if html:
            captured["html"] = self.evaluate("document.documentElement.outerHTML")
        return captured

    def close(self):
        try:
            self.call("Browser.close")
        except SystemExit:
            pass
        try:
            self.process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()
        # The profile is the browser's scratch: a run leaves none behind.
        shutil.rmtree(self.profile, ignore_errors=True)


def main():
    with open(sys.argv[1]) as file:
        script = json.load(file)
    browser = Browser()
    captures = []
    try:
        for step in script["steps"]:
            browser.step(step.get("seconds", TIMEOUT))
            if "goto" in step:
                browser.goto(step["goto"])
            elif "click" in step:
                browser.click(step["click"])
            elif "wait" in step:
                browser.wait(step["wait"])
            elif "capture" in step:
                captures.append(browser.capture(step["capture"], script["shots"], step.get("html", False)))
            else:
                raise SystemExit(f"unknown step {step}")
    finally:
        browser.step(TIMEOUT)
        browser.close()
    print(json.dumps({"captures": captures}))


if __name__ == "__main__":
    main()
