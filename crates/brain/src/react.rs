//! The ReAct loop: think (one model call), act (run the tool calls it asked for), observe
//! (feed the results back), until the model answers without tool calls or a guardrail stops it.

use std::time::Instant;

use nerve_core::event::{CallPurpose, ToolCallFinished, ToolCallStarted, TurnCompleted};
use nerve_core::{Event, Message, TerminationReason, ToolCall, ToolResult, TurnRecord};

use crate::engine::{Run, Stop};
use crate::provider::FinishReason;

pub(crate) async fn run(run: &mut Run) -> Stop {
    loop {
        if let Err(stop) = run.check_boundary() {
            return stop;
        }
        match turn(run).await {
            Ok(Some(done)) => return done,
            Ok(None) => {}
            Err(stop) => return stop,
        }
    }
}

/// One turn. `Ok(Some(..))` when the model finished.
async fn turn(run: &mut Run) -> Result<Option<Stop>, Stop> {
    let started = Instant::now();
    let number = run.ctx.turn_count() + 1;
    let response = run.call_model(number, CallPurpose::Agent).await?;
    let calls: Vec<ToolCall> = response.message.tool_calls().cloned().collect();
    run.push_message(response.message).await?;
    for call in &calls {
        execute_tool(run, number, call).await?;
    }
    let record = TurnRecord {
        turn: number,
        usage: response.usage,
        cost: run.config.pricing.cost(response.usage),
        tool_calls: calls.clone(),
        finish: response.finish.as_str().to_owned(),
        duration_ms: u64::try_from(started.elapsed().as_millis()).unwrap_or(u64::MAX),
    };
    run.record(Event::TurnCompleted(TurnCompleted {
        turn: record.turn,
        usage: record.usage,
        cost: record.cost,
        tool_calls: calls.iter().map(|c| c.name.clone()).collect(),
        finish: record.finish.clone(),
        duration_ms: record.duration_ms,
    }))
    .await?;
    run.ctx.turns.push(record);
    if calls.is_empty() {
        return Ok(match response.finish {
            FinishReason::MaxTokens => {
                run.push_message(Message::user("Your answer was cut off by the output limit. Continue exactly where you stopped.")).await?;
                None
            }
            FinishReason::Stop | FinishReason::ToolCalls => Some(Stop {
                reason: TerminationReason::Completed,
                error: None,
            }),
        });
    }
    Ok(None)
}

async fn execute_tool(run: &mut Run, turn: u32, call: &ToolCall) -> Result<(), Stop> {
    run.record(Event::ToolCallStarted(ToolCallStarted {
        turn,
        call: call.clone(),
    }))
    .await?;
    let started = Instant::now();
    let output = run
        .tools
        .execute(call)
        .await
        .map_err(|e| Stop::new(TerminationReason::Error, e.to_string()))?;
    let result = ToolResult {
        call_id: call.id.clone(),
        name: call.name.clone(),
        content: output.content,
        is_error: output.is_error,
    };
    run.record(Event::ToolCallFinished(ToolCallFinished {
        turn,
        result: result.clone(),
        duration_ms: u64::try_from(started.elapsed().as_millis()).unwrap_or(u64::MAX),
    }))
    .await?;
    run.push_message(Message::tool_result(result)).await?;
    Ok(())
}
