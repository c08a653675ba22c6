// nerve serve's web view: follows an execution's event stream on its page. Each event that
// arrives becomes an item of the live list (its text set as text, never as markup); at the
// finish event, or when the stream ends without one, the page is loaded again, so what the
// server renders (state, totals, approvals, the diff per turn) is current. Without this
// script the page is complete as the server rendered it.
(function () {
  'use strict';
  var live = document.getElementById('live');
  if (!live) {
    return;
  }
  var execution = live.getAttribute('data-execution');
  var after = live.getAttribute('data-after');
  var source = new EventSource('/api/v1/executions/' + execution + '/events?after=' + after);

  function clip(text) {
    text = String(text === undefined || text === null ? '' : text);
    return text.length > 300 ? text.slice(0, 300) + '…' : text;
  }

  function texts(parts) {
    return (parts || [])
      .filter(function (part) { return part.type === 'text'; })
      .map(function (part) { return part.text; })
      .join(' ');
  }

  // One line about an event, from its payload (`events --json`'s form).
  function describe(event) {
    var p = event.payload || {};
    switch (event.kind) {
      case 'message_appended':
        return p.message.role + ': ' + texts(p.message.parts);
      case 'tool_call_started':
        return p.call.name + ' ' + JSON.stringify(p.call.arguments);
      case 'tool_call_finished':
        return p.result.name + (p.result.is_error ? ' failed: ' : ': ') + p.result.content;
      case 'turn_completed':
        return 'turn ' + p.turn + ' (' + p.usage.input_tokens + ' in, ' + p.usage.output_tokens + ' out)';
      case 'approval_requested':
        return p.call.name + ' waits for a decision (rule ' + p.rule + ')';
      case 'approval_decided':
        return p.call_id + ' ' + p.decision;
      case 'finish':
        return p.termination_reason;
      default:
        return '';
    }
  }

  function reload() {
    source.close();
    window.location.reload();
  }

  source.onmessage = function (message) {
    var event = JSON.parse(message.data);
    var item = document.createElement('li');
    item.className = 'event';
    item.setAttribute('data-seq', event.seq);
    item.setAttribute('data-kind', event.kind);
    item.textContent = event.seq + ' ' + event.kind + ' ' + clip(describe(event));
    live.appendChild(item);
    if (event.kind === 'finish') {
      reload();
    }
  };
  // The stream ended without a finish event (the client had seen it, or the server went
  // away): the page as the server has it now, after a moment.
  source.onerror = function () {
    source.close();
    window.setTimeout(reload, 1000);
  };
}());
