"""Drives the playground page in headless Chromium over the DevTools protocol (on a pipe: the standard library
suffices): loads the page, sets temperature 0 and the token limit, types a message, sends it, and waits until the
streamed answer is complete. Prints the page's state as JSON: the user's and the assistant's bubbles and the stats.

    python3 playground.py CHROMIUM URL MESSAGE MAX_TOKENS PROFILE_DIR
"""
import json
import os
import subprocess
import sys
import time

chromium, url, message, max_tokens, profile = sys.argv[1:6]
to_chrome_r, to_chrome_w = os.pipe()
from_chrome_r, from_chrome_w = os.pipe()


def pipes():
    # The pipe ends may themselves be fds 3 and 4: move them out of the way first.
    os.dup2(to_chrome_r, 100)
    os.dup2(from_chrome_w, 101)
    os.dup2(100, 3)
    os.dup2(101, 4)


log = open(os.path.join(os.path.dirname(profile), "chromium.log"), "w")
browser = subprocess.Popen(
    [chromium, "--headless=new", "--remote-debugging-pipe", "--no-sandbox", "--disable-gpu",
     "--no-first-run", f"--user-data-dir={profile}", "about:blank"],
    preexec_fn=pipes, close_fds=False, stdout=subprocess.DEVNULL, stderr=log)
os.close(to_chrome_r)
os.close(from_chrome_w)
pending = b""
next_id = 0


def call(method, session=None, **params):
    global pending, next_id
    next_id += 1
    message = {"id": next_id, "method": method, "params": params}
    if session:
        message["sessionId"] = session
    os.write(to_chrome_w, json.dumps(message).encode() + b"\0")
    while True:
        while b"\0" not in pending:
            chunk = os.read(from_chrome_r, 1 << 16)
            if not chunk:
                raise SystemExit("chromium closed the pipe")
            pending += chunk
        raw, pending = pending.split(b"\0", 1)
        reply = json.loads(raw)
        if reply.get("id") == next_id:
            if "error" in reply:
                raise SystemExit(f"{method}: {reply['error']}")
            return reply["result"]


def evaluate(session, expression):
    result = call("Runtime.evaluate", session, expression=expression, returnByValue=True, awaitPromise=True)
    if "exceptionDetails" in result:
        raise SystemExit(f"{expression}: {result['exceptionDetails']}")
    return result["result"].get("value")


def wait(session, expression, seconds=60):
    deadline = time.time() + seconds
    while time.time() < deadline:
        value = evaluate(session, f"(() => {{ try {{ return {expression}; }} catch (e) {{ return false; }} }})()")
        if value:
            return value
        time.sleep(0.1)
    raise SystemExit(f"timed out waiting for {expression}")


try:
    target = call("Target.createTarget", url=url)["targetId"]
    session = call("Target.attachToTarget", targetId=target, flatten=True)["sessionId"]
    wait(session, "document.readyState === 'complete' && document.getElementById('model').textContent !== ''")
    evaluate(session, f"""
        document.getElementById('temperature').value = '0';
        document.getElementById('max_tokens').value = '{max_tokens}';
        document.getElementById('prompt').value = {json.dumps(message)};
        document.getElementById('send').click();
        true""")
    wait(session, "document.querySelector('.assistant') !== null && document.getElementById('send').disabled === false"
                  " && document.getElementById('stats').textContent.includes('tokens,')")
    state = evaluate(session, """({
        user: [...document.querySelectorAll('.user')].map((e) => e.textContent),
        assistant: [...document.querySelectorAll('.assistant')].map((e) => e.textContent),
        errors: [...document.querySelectorAll('.error')].map((e) => e.textContent),
        stats: document.getElementById('stats').textContent,
        model: document.getElementById('model').textContent,
    })""")
    print(json.dumps(state))
finally:
    browser.kill()
    browser.wait()
